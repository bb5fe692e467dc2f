"""The node agent's watch picture (``hami.node.podcache``) as pure logic: which version of a
pod it keeps when events and the agent's own writes arrive out of order."""

from __future__ import annotations

from typing import Any, cast

from hami.kube.client import Kube
from hami.node.podcache import NodeCache, newer_or_same

NODE = "n1"


def pod(name: str, rv: str, node: str = NODE, note: str = "") -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "resourceVersion": rv,
            "annotations": {"note": note},
        },
        "spec": {"nodeName": node},
    }


def cache() -> NodeCache:
    # the watches are never started here: only the handlers and the picture are exercised
    return NodeCache(cast(Kube, object()), NODE)


def test_a_late_event_does_not_replace_a_newer_write() -> None:
    c = cache()
    c._on_pod("ADDED", pod("p", "10", note="bound"))
    c.remember(pod("p", "12", note="our write"))
    c._on_pod("MODIFIED", pod("p", "11", note="late event"))
    found = c.pod("ns", "p")
    assert found is not None and found["metadata"]["annotations"]["note"] == "our write"
    c._on_pod("MODIFIED", pod("p", "13", note="newer event"))
    found = c.pod("ns", "p")
    assert found is not None and found["metadata"]["annotations"]["note"] == "newer event"


def test_a_write_answer_does_not_bring_back_a_deleted_pod() -> None:
    c = cache()
    c._on_pod("ADDED", pod("p", "10"))
    c._on_pod("DELETED", {"metadata": {"namespace": "ns", "name": "p"}})
    c.remember(pod("p", "12"))
    assert c.pod("ns", "p") is None and list(c.pods()) == []


def test_versions_that_are_not_numbers_are_taken_in_arrival_order() -> None:
    assert newer_or_same(pod("p", "9"), pod("p", "10")) is False
    assert newer_or_same(pod("p", "10"), pod("p", "10")) is True
    assert newer_or_same(pod("p", "abc"), pod("p", "10")) is True
    assert newer_or_same(pod("p", "1"), None) is True


def test_the_node_picture_keeps_the_newest_and_forgets_a_deleted_node() -> None:
    c = cache()
    c._on_node("ADDED", {"metadata": {"name": NODE, "resourceVersion": "5"}})
    c._on_node("MODIFIED", {"metadata": {"name": NODE, "resourceVersion": "4"}})
    assert c.node_object is not None and c.node_object["metadata"]["resourceVersion"] == "5"
    c._on_node("DELETED", {"metadata": {"name": NODE}})
    assert c.node_object is None


def test_a_cache_that_never_listed_is_not_current() -> None:
    c = cache()
    assert "has not listed yet" in (c.not_current() or "")
    assert c.status()["current"] is False
