"""The YAML ledger: one file per result, append-only, readable by people and by pandas (design: docs/ledger.md).

`schema` says what a record may hold, `store` writes and reads the directory (never trusting a file), `index` is
the derived index that makes reading fast, `figures` turns a record into the figures a person reads and the flat
rows scripts read. This package returns data and raises `LedgerError`; it never prints. pandas is imported only
by `figures.to_frame` and `figures.export`.
"""

from minfer_cli.ledger.figures import (
    COLUMNS,
    FORMATS,
    PCT_DIGITS,
    arm_text,
    arms_text,
    export,
    record_arms_text,
    to_frame,
)
from minfer_cli.ledger.schema import (
    ARM_STATUSES,
    ID_MAX,
    KINDS,
    KINDS_WITH_BAR,
    KINDS_WITH_WORKLOAD_ARMS,
    SCHEMA,
    VERDICTS,
    validate,
)
from minfer_cli.ledger.store import (
    RECORD_MAX_BYTES,
    AppendResult,
    LedgerContents,
    Problem,
    append,
    check_writable,
    find,
    get,
    ledger_dir,
    load,
    parse_id,
    parse_since,
    query,
    save_unrecorded,
    slugify,
    utc_timestamp,
)

__all__ = [
    "ARM_STATUSES", "AppendResult", "COLUMNS", "FORMATS", "ID_MAX", "KINDS", "KINDS_WITH_BAR",
    "KINDS_WITH_WORKLOAD_ARMS", "LedgerContents", "PCT_DIGITS", "Problem", "RECORD_MAX_BYTES", "SCHEMA", "VERDICTS",
    "append", "arm_text", "arms_text", "check_writable", "export", "find", "get", "ledger_dir", "load", "parse_id",
    "parse_since", "query", "record_arms_text", "save_unrecorded", "slugify", "to_frame", "utc_timestamp", "validate",
]
