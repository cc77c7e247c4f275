"""The servers fi-convert's outputs are loaded into, one package each (`vllm/`: the vLLM plugin and every vLLM fact).

The core never imports a server package; a server package imports the core's `format/` and leaf modules only.
"""
