"""Stop signals during training: remembered, so the run finishes its step, saves and stops cleanly."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import torch
import torch.distributed as dist

from opengem.train import distributed


class StopSignals:
    """SIGINT/SIGTERM while installed are remembered, not raised, so the training loop can finish its step,
    save a checkpoint and stop cleanly; a second SIGINT stops at once (KeyboardInterrupt). Installed only
    from the main thread (Python delivers signals there); :meth:`restore` puts the old handlers back."""

    EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}

    def __init__(self, announce: bool = True) -> None:
        self.code = 0
        self._announce = announce
        self._old: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in self.EXIT_CODES:
                self._old[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        if self.code and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.code = self.code or self.EXIT_CODES[signal.Signals(signum)]
        if self._announce:  # os.write: safe inside a signal handler, unlike print
            again = " (Ctrl-C again stops at once)" if signum == signal.SIGINT else ""
            os.write(2, f"opengem train: {signal.Signals(signum).name}: stopping after this step and saving "
                        f"a checkpoint{again}\n".encode())

    def requested(self, device: torch.device) -> int:
        """The exit code of a stop any rank received (0: none); collective under several ranks."""
        if distributed.world_size() == 1:
            return self.code
        t = torch.tensor([self.code], dtype=torch.int32, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}
