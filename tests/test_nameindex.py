"""``hami.core.nameindex``: a whole list of names looked up at once by their hashes."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from hami.core.nameindex import MISSING, NameIndex


class SameHash(str):
    """A name whose hash collides with every other one of its kind."""

    __slots__ = ()

    def __hash__(self) -> int:
        return 42


operations = st.lists(
    st.tuples(
        st.sampled_from(["set", "pop", "look"]),
        st.integers(0, 30),
        st.integers(0, 5),
    ),
    max_size=80,
)


@settings(max_examples=80, deadline=None)
@given(operations)
def test_lookups_equal_the_plain_mapping_after_any_changes(ops: list[tuple[str, int, int]]) -> None:
    """Names set, changed and removed between lookups (the sorted hashes built, updated
    in place, built again): every lookup equals the plain dictionary's answer."""
    index = NameIndex()
    plain: dict[str, int] = {}
    rng = random.Random(len(ops))
    for op, number, value in ops:
        name = f"node-{number}"
        if op == "set":
            index.set(name, value)
            plain[name] = value
        elif op == "pop":
            assert index.pop(name) == plain.pop(name, None)
        else:
            asked = [f"node-{rng.randrange(40)}" for _ in range(rng.randrange(0, 20))]
            found = index.lookup(asked).tolist()
            assert found == [plain.get(n, MISSING) for n in asked]
        assert len(index) == len(plain)


def test_stored_names_of_one_hash_fall_back_to_the_dictionary() -> None:
    index = NameIndex()
    index.set(SameHash("a"), 1)
    index.set(SameHash("b"), 2)
    index.set("c", 3)
    assert index.lookup([SameHash("b"), SameHash("a"), "c", "d"]).tolist() == [2, 1, 3, MISSING]
    index.pop(SameHash("b"))  # one left: the sorted hashes serve again
    assert index.lookup([SameHash("a"), "c", "d"]).tolist() == [1, 3, MISSING]


def test_fresh_strings_equal_to_stored_names_are_found() -> None:
    """The lists come freshly decoded: equal strings, other objects."""
    index = NameIndex()
    for i in range(100):
        index.set(f"gpu-node-{i:03d}", i % 7)
    asked = "".join(f"gpu-node-{i:03d} " for i in range(99, -1, -3)).split()
    assert index.lookup(asked).tolist() == [i % 7 for i in range(99, -1, -3)]
    assert index.lookup([]).tolist() == []


def test_a_changed_value_is_read_without_building_again() -> None:
    index = NameIndex()
    for i in range(10):
        index.set(f"n{i}", i)
    assert index.lookup(["n3", "n7"]).tolist() == [3, 7]  # built
    index.set("n3", 30)  # a known name: changed in place
    assert index.lookup(["n3", "n7", "n9"]).tolist() == [30, 7, 9]
    index.set("n10", 10)  # a new one, and one gone: built again
    index.pop("n7")
    assert index.lookup(["n3", "n7", "n10"]).tolist() == [30, MISSING, 10]
