"""The options of serving, now each in its room: the client's in `serving/client/options.py` (`RemoteOptions`,
`local_only`), the server's in `serving/server/options.py` (`ServerLimits`, `SERVER_TOKEN_BUDGET`); every name is
still importable here."""

from .client.options import INPUT_FORMATS, RemoteOptions, local_only  # noqa: F401
from .server.options import SERVER_TOKEN_BUDGET, ServerLimits  # noqa: F401
