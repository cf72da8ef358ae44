"""Test-wide set-up. The suite imports `opcompiler` the way a user does: from whatever is
installed (editable or wheel), never by putting the repository root on `sys.path`.

Every test gets its own user tuning-log directory (OPC_LOG_DIR), so no test reads records a
user or another test wrote, and none writes outside its tmp_path. The shipped templates are loaded once, as every entry point
(`opcompiler.api`, the CLI, the tuner) loads them: the tests call backends and lookups directly."""
import pytest

import opcompiler.schedules  # noqa: F401  (every shipped template registered up front; the registry's first lookup loads them too)


@pytest.fixture(autouse=True)
def _private_log_dir(tmp_path_factory, monkeypatch):
    from opcompiler.settings import settings
    monkeypatch.setenv("OPC_LOG_DIR", str(tmp_path_factory.mktemp("user_logs")))
    settings.cache_clear()
    yield
    settings.cache_clear()
