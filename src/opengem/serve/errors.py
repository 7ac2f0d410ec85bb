"""Errors of the serving path.

A client of the Predictor (or of part B's HTTP server) may send anything: every problem with a request
is a :class:`BadRequest` with a one-line reason (the server answers it with a 4xx), never a crash deep in
PyTorch. A broken or tampered export artifact is an :class:`ArtifactError`: the operator's problem, not
the client's, so the server refuses the version and keeps serving the old one.
"""

from __future__ import annotations

from opengem.errors import OpengemError


class BadRequest(OpengemError, ValueError):
    """A scoring request that cannot be served as sent: unknown feature, wrong type, too many candidates,
    missing or unknown surface, ... The message is one line that names the field and says what is wrong."""

    exit_code = 2


class ArtifactError(OpengemError, ValueError):
    """An export artifact that is missing a file, fails its digest, or holds something we will not load."""
