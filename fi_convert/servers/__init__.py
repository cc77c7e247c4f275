"""The servers that load fi-convert's outputs, one package each (`vllm/`: the vLLM plugin and
every vLLM fact).

The core never imports a server's package; a server's package imports the core's `format/` and
leaf modules only.
"""
