"""Two messages that packages we import print on every command and that ask nothing of our users, filtered out.

- bitsandbytes (the `quantization` extra), on a CPU whose optional `kernels` package is missing: "Failed to load CPU
  gemm_4bit_forward from kernels-community ..." (it then uses its own CPU kernel);
- DeepSpeed (the `deepspeed` extra), on a machine without a GPU: "Setting accelerator to CPU. If you have GPU or other
  accelerator, we were unable to detect it."

Each is dropped by a filter on the one logger that prints it, matching that message only: every other message of
those packages is printed.
"""

from __future__ import annotations

import logging

NOISE = {
    "bitsandbytes.backends.cpu.ops": "Failed to load CPU gemm_4bit_forward from kernels-community",
    "DeepSpeed": "Setting accelerator to CPU.",
}
"""Logger name -> the start of the one message dropped from it."""


class _DropMessage(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


def quiet_import_noise() -> None:
    """Install the filters (once: called when `trl_rm_env` is imported, before the packages that print them)."""
    for name, start in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) for f in logger.filters):
            logger.addFilter(_DropMessage(start))
