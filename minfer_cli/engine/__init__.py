"""The inference engine built from minfer's kernels: model configs and presets, GGUF loading and writing,
random weights generated on the GPU, and a numpy float64 reference forward (the oracle for the GPU engine).

Modules: `config` (ModelConfig, TensorSpec, the Q4_K_M type mix), `presets` (named configs), `weights`
(ModelWeights, synth_weights, load_gguf), `gguf_io` (write_gguf), `reference` (Reference: forward, greedy),
`errors` (ModelError). Nothing here touches the GPU at import time.
"""
