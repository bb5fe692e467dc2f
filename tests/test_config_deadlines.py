"""scheduler.decision_timeout: its default and the rule that keeps binds safe (issue 9)."""

from __future__ import annotations

import pytest

from hami import config
from hami.core.cluster import DEFAULT_DECISION_TIMEOUT


def test_the_default_decision_timeout_is_the_core_default() -> None:
    seconds = config.from_mapping({}, env={}).scheduler.decision_timeout.seconds
    assert seconds == DEFAULT_DECISION_TIMEOUT.total_seconds() == 90


def test_a_decision_timeout_a_bind_could_outlast_is_refused() -> None:
    raw = {"scheduler": {"decision_timeout": "20s", "bind_lock_wait": "20s"}}
    with pytest.raises(config.ConfigError, match=r"scheduler\.decision_timeout"):
        config.from_mapping(raw, env={})
    raw = {"scheduler": {"decision_timeout": "2m"}}
    assert config.from_mapping(raw, env={}).scheduler.decision_timeout.seconds == 120
