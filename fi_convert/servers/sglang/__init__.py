"""fi-convert's SGLang plugin: `python -m sglang.launch_server --model-path OUT_DIR
--load-format fi-convert --moe-runner-backend flashinfer_trtllm [--tp N]`.

Installed with fi-convert's `sglang` extra; SGLang (0.5.20-0.5.23) runs `register` from its
`sglang.srt.plugins` entry point in every process that loads plugins (the launcher before it
parses arguments, the engine, every scheduler process), then applies the hooks registered
here (`HookRegistry.apply_hooks`). Nothing else in fi-convert imports SGLang.
"""

from __future__ import annotations

from .target import LOAD_FORMAT


def register() -> None:
    """Add `fi-convert` to SGLang's --load-format choices and register the plugin's hooks
    (config.HOOKS) with SGLang's hook registry (idempotent: SGLang loads plugins once per
    process, and skips targets already patched)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.server_args import LOAD_FORMAT_CHOICES, add_load_format_choices

    from . import config

    if LOAD_FORMAT not in LOAD_FORMAT_CHOICES:
        add_load_format_choices([LOAD_FORMAT])
    registered = {(t, h) for t, hooks in HookRegistry._hooks.items() for _, h, _ in hooks}
    for target, name, kind in config.HOOKS:
        hook = getattr(config, name)
        if (target, hook) not in registered:
            HookRegistry.register(target, hook, HookType[kind])
