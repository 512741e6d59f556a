"""Assemble PTX to a cubin without a GPU, through the nvJitLink that numba-cuda[cu13] installs (`cuda.bindings`):
the `compile` checks then know that ptxas accepts an inline-PTX instruction (operand types, state spaces, the
target's features), not only that NVVM pasted its text into the PTX."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile


def assemble(ptx: str, arch: str = "sm_90a") -> bytes:
    """The cubin of ``ptx`` for ``arch`` (the ``.target`` line is set to it: numba writes ``sm_90`` for cc 9.0
    where the device build targets ``sm_90a``); AssertionError with nvJitLink's log when ptxas refuses it."""
    return _link(ptx, arch, verbose=False)[0]


def ptxas_resources(ptx: str, arch: str = "sm_90a") -> dict:
    """What ptxas reports for the (single) kernel of ``ptx``: ``registers`` a thread, ``spill_bytes`` (stores +
    loads), ``local_bytes`` (stack frame), ``shared_bytes`` (static) and ``wgmma_serialized``: whether ptxas warned
    "wgmma.mma_async instructions are serialized" for any reason (it then waits for each wgmma before the next: a
    call in the function, e.g. a 64-bit integer or IEEE float division, is enough (C7509); so are registers a
    wgmma reads written inside its pipeline stage, or too few registers)."""
    return _report(_link(ptx, arch, verbose=True)[1])


def _report(log: str) -> dict:
    regs = re.findall(r"[Uu]sed (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    stack = re.findall(r"(\d+) stack\b", log)
    smem = re.findall(r"(\d+) bytes smem", log)
    if not regs:
        raise AssertionError(f"ptxas printed no register count: {log[-400:]}")
    return {"registers": int(regs[-1]), "spill_bytes": sum(map(int, spills[-1])) if spills else 0,
            "local_bytes": int(stack[-1]) if stack else 0, "shared_bytes": int(smem[-1]) if smem else 0,
            "wgmma_serialized": "instructions are serialized" in log}


def _link(ptx: str, arch: str, verbose: bool) -> tuple[bytes, str]:
    from minfer_cli.measure.resources import assemble_ptx

    try:
        return assemble_ptx(ptx, arch, verbose)
    except RuntimeError as exc:
        raise AssertionError(str(exc)) from None


def whole_program_resources(ptx: str, arch: str = "sm_90a") -> dict | None:
    """`ptxas_resources` of ``ptx`` assembled as one program (ptxas without ``-c``: what the driver's JIT does for
    `kernels.jit.load_whole_program`, where ``setmaxnreg`` holds), by the CUDA toolkit's ``ptxas`` on PATH (its
    ``.version`` lowered to what that ptxas reads); None when no ptxas is installed (CI has only nvJitLink)."""
    from kernels.jit import ptx_for_isa, ptx_isa_of_driver

    exe = shutil.which("ptxas")
    if exe is None:
        return None
    release = re.search(r"release (\d+)\.(\d+)", subprocess.run([exe, "--version"], capture_output=True,
                                                                 text=True).stdout)
    isa = ptx_isa_of_driver(int(release[1]) * 1000 + int(release[2]) * 10) if release else None
    ptx = "\n".join(f".target {arch}" if line.startswith(".target ") else line for line in ptx.splitlines())
    with tempfile.TemporaryDirectory() as tmp:
        src = f"{tmp}/kernel.ptx"
        with open(src, "w") as f:
            f.write(ptx_for_isa(ptx, isa))
        run = subprocess.run([exe, f"-arch={arch}", "-v", src, "-o", f"{tmp}/kernel.cubin"], capture_output=True,
                             text=True)
    log = run.stdout + run.stderr
    if run.returncode:
        raise AssertionError(f"ptxas refused the PTX: {log[-400:]}")
    return _report(log)


_WGMMA = re.compile(r"wgmma\.mma_async[^{]*\{([^}]*)\},\s*(\{[^}]*\}|%\w+)")
_DEST = re.compile(r"^\s*(?:@!?%\w+\s+)?[a-z][\w.:]*\s+(%\w+)\s*,")


def wgmma_register_hazards(ptx: str) -> list[str]:
    """Instructions of ``ptx`` that write a register an issued ``wgmma.mma_async`` still reads or accumulates into
    (its D registers, and its A registers in the register-A form) before the next ``wgmma.wait_group``, in text
    order (the main loops are straight-line between the two): undefined behaviour by the PTX ISA (§9.7.15.5), and
    what NVVM produces when it computes the next tile's A fragment into the registers of the one in flight. Each
    entry names the line. Inline-asm blocks are scanned statement by statement; other wgmma instructions may
    accumulate into the same D registers (the ISA allows that)."""
    hazards, live = [], set()
    for number, line in enumerate(ptx.splitlines(), 1):
        for statement in line.split(";"):
            if "wgmma.wait_group" in statement:
                live = set()
                continue
            found = _WGMMA.search(statement)
            if found:
                live |= set(re.findall(r"%\w+", found[1]))
                if found[2].startswith("{"):
                    live |= set(re.findall(r"%\w+", found[2]))
                continue
            dest = _DEST.match(statement.strip("{ \t"))
            if live and dest and dest[1] in live and not statement.strip().startswith(("setp", "st.")):
                hazards.append(f"line {number}: {statement.strip()} (written while a wgmma reads it)")
    return hazards
