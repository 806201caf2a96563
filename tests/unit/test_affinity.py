"""Session keys and rendezvous hashing with bounded loads, pure."""

from __future__ import annotations

from collections import Counter

from gateway.policy.affinity import by_affinity, later_turn, load_bound, session_key, stable_hash

SYSTEM = {"role": "system", "content": "You are terse. " * 100}
NAMES = ("a", "b", "c")
SEEDS = {n: stable_hash(n.encode()) for n in NAMES}


def turns(first_user: str, n: int) -> list[list[dict[str, str]]]:
    """A conversation's requests: each turn repeats all before it and adds one."""
    messages = [SYSTEM, {"role": "user", "content": first_user}]
    out = [list(messages)]
    for i in range(n - 1):
        messages += [
            {"role": "assistant", "content": f"answer {i}"},
            {"role": "user", "content": f"more {i}"},
        ]
        out.append(list(messages))
    return out


def rank(key: int, loads: dict[str, float] | None = None, balance: float = 0.25):
    loads = loads or {}
    return by_affinity(NAMES, key, SEEDS.__getitem__, lambda n: loads.get(n, 0.0), balance)


def test_the_header_comes_first_then_user_then_the_opening() -> None:
    body = {"messages": turns("hi", 1)[0], "user": "u-1"}
    assert session_key(b"s-9", body, 512) == (stable_hash(b"s-9"), "header")
    assert session_key(b"", body, 512) == (stable_hash(b"u-1"), "user")
    key = session_key(b"", {"messages": body["messages"]}, 512)
    assert key is not None
    assert key[1] == "prefix"
    assert session_key(b"", {"messages": body["messages"]}, 0) is None  # prefix keys off
    assert session_key(b"", {"model": "m"}, 512) is None


def test_every_turn_of_a_conversation_shares_its_key_and_conversations_differ() -> None:
    one = {session_key(b"", {"messages": m}, 512) for m in turns("plan a trip", 5)}
    two = {session_key(b"", {"messages": m}, 512) for m in turns("fix my code", 5)}
    assert len(one) == len(two) == 1
    assert one != two  # the same system prompt, another first question


def test_a_text_prompt_is_keyed_by_its_first_characters() -> None:
    long = "x" * 600
    assert session_key(b"", {"prompt": long + "a"}, 512) == session_key(
        b"", {"prompt": long + "b"}, 512
    )
    assert session_key(b"", {"prompt": "a" + long}, 512) != session_key(
        b"", {"prompt": "b" + long}, 512
    )
    assert session_key(b"", {"prompt": [1, 2, 3]}, 512) is not None  # token ids


def test_keys_spread_evenly_and_stay_put() -> None:
    homes = Counter(rank(stable_hash(b"%d" % i))[0][0] for i in range(3000))
    assert set(homes) == set(NAMES)
    assert all(900 <= n <= 1100 for n in homes.values()), homes
    for i in range(50):
        key = stable_hash(b"%d" % i)
        assert rank(key) == rank(key)


def test_a_backend_leaving_moves_only_the_keys_it_held() -> None:
    def home(key: int, names: tuple[str, ...]) -> str:
        return by_affinity(names, key, SEEDS.__getitem__, lambda n: 0.0, 0.25)[0][0]

    keys = [stable_hash(b"k%d" % i) for i in range(500)]
    for key in keys:
        before = home(key, NAMES)
        if before != "c":
            assert home(key, ("a", "b")) == before


def test_a_backend_past_its_bound_passes_the_key_to_its_next_choice() -> None:
    key = stable_hash(b"session")
    ranked, own = rank(key)
    first, second, third = ranked
    assert own
    # Load 8 on it, 0 elsewhere: the bound is ceil(1.25 * 9 / 3) = 4.
    assert load_bound([8, 0, 0], 0.25) == 4
    spilled, own = rank(key, {first: 8})
    assert (spilled, own) == ([second, first, third], False)
    # Under the bound it keeps the key, even when heavier than the others.
    kept, own = rank(key, {first: 2, second: 1, third: 1})  # bound ceil(1.25 * 5 / 3) = 3
    assert (kept[0], own) == (first, True)
    # The next choice full too: the third.
    assert rank(key, {first: 8, second: 8})[0][0] == third


def test_a_later_turn_is_one_with_an_assistant_message() -> None:
    first = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]}
    later = {"messages": [*first["messages"], {"role": "assistant", "content": "a"},
                          {"role": "user", "content": "q2"}]}  # fmt: skip
    responses = {"input": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}]}
    assert not later_turn(first)
    assert later_turn(later)
    assert later_turn(responses)
    assert not later_turn({"prompt": "text"})
