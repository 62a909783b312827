"""How a tracked run's status follows the way its block of work ends (no mlflow here)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class StatusGuarded:
    """A tracker whose ``end(status)`` closes the run; ``status_guard`` picks the status."""

    def end(self, status: str = "FINISHED") -> bool:
        raise NotImplementedError

    @contextlib.contextmanager
    def status_guard(self) -> Iterator[None]:
        """FINISHED when the block returns, KILLED on a signal or Ctrl-C, FAILED on any other error."""
        try:
            yield
        except KeyboardInterrupt:
            self.end("KILLED")
            raise
        except SystemExit:
            # every SystemExit out of training is a stop from outside: Lightning's SIGTERM
            # (SIGTERMException, code None), its Ctrl-C (sys.exit(1)) and our RunStopped
            self.end("KILLED")
            raise
        except BaseException:
            self.end("FAILED")
            raise
        else:
            self.end("FINISHED")


__all__ = ["StatusGuarded"]
