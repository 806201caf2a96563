"""Recommendations: best method per load, crossovers, K schedules."""

from __future__ import annotations

from planner.recommend import Point, best_per_concurrency, crossovers, grid, k_schedule


def p(method: str, k: int, c: int, tps: float, itl: float = 10.0) -> Point:
    return Point(method, k, c, tps, itl, 1.0)


POINTS = [
    p("plain", 0, 1, 100),
    p("eagle3", 3, 1, 180, itl=30),
    p("eagle3", 5, 1, 150),
    p("plain", 0, 8, 700),
    p("eagle3", 3, 8, 900),
    p("eagle3", 5, 8, 950),
    p("plain", 0, 64, 4000),
    p("eagle3", 3, 64, 3500),
    p("eagle3", 5, 64, 3000),
]


def test_best_per_concurrency_respects_the_itl_objective() -> None:
    choices = best_per_concurrency(POINTS, itl_objective_ms=20)
    assert [(c.concurrency, c.best.method, c.best.k) for c in choices] == [
        (1, "eagle3", 5),  # K=3 is faster but breaks the 20 ms objective
        (8, "eagle3", 5),
        (64, "plain", 0),
    ]
    assert crossovers(choices) == [(64, "eagle3", "plain")]


def test_k_schedule_uses_the_methods_own_best_k_and_zero_where_plain_wins() -> None:
    assert k_schedule(POINTS, "eagle3") == [(1, 1, 3), (2, 8, 5), (9, 64, 0)]


def test_grid_on_the_catalogs_shows_the_published_shape() -> None:
    points = grid("openai/gpt-oss-20b", "B200", workload="code", concurrency=(1, 64))
    best_k = {
        (m, c): max(
            (x for x in points if x.method == m and x.concurrency == c),
            key=lambda x: x.output_tokens_per_s,
        ).k
        for m in ("eagle3", "p-eagle")
        for c in (1, 64)
    }
    assert best_k[("eagle3", 1)] <= 4  # autoregressive drafting peaks early
    assert best_k[("p-eagle", 1)] >= 6  # parallel drafting keeps gaining
    assert best_k[("p-eagle", 64)] < best_k[("p-eagle", 1)]  # less K under load


def test_best_per_method_takes_each_methods_fastest_k_within_the_objective() -> None:
    from planner.recommend import Point, best_per_method

    points = [
        Point("eagle3", 1, 4, 100.0, 10.0, 1.0),
        Point("eagle3", 3, 4, 150.0, 30.0, 0.7),  # fastest, but too slow per token
        Point("eagle3", 2, 4, 120.0, 20.0, 0.8),
        Point("plain", 0, 4, 80.0, 12.0, 1.2),
        Point("plain", 0, 1, 25.0, 40.0, 4.0),  # misses the objective: still its only point
    ]
    curves = best_per_method(points, itl_objective_ms=25.0)
    assert [(p.concurrency, p.k) for p in curves["eagle3"]] == [(4, 2)]
    assert [p.concurrency for p in curves["plain"]] == [1, 4]  # sorted by concurrency
    assert best_per_method(points, None)["eagle3"][0].k == 3


def test_more_speculation_must_pay_by_the_margin() -> None:
    from planner.recommend import MORE_SPECULATION_MARGIN

    assert MORE_SPECULATION_MARGIN == 0.02
    close = [p("plain", 0, 8, 1000), p("eagle3", 3, 8, 1300), p("eagle3", 4, 8, 1310)]
    assert best_per_concurrency(close, None)[0].best.k == 3  # K=4 is 0.8% faster: a tie
    clear = [p("plain", 0, 8, 1000), p("eagle3", 3, 8, 1300), p("eagle3", 4, 8, 1330)]
    assert best_per_concurrency(clear, None)[0].best.k == 4  # 2.3% faster: it pays
    marginal = [p("plain", 0, 8, 1000), p("eagle3", 2, 8, 1015)]
    assert best_per_concurrency(marginal, None)[0].best.method == "plain"
    assert k_schedule(marginal, "eagle3") == [(1, 8, 0)]
    # another method is no "more speculation": the fastest method wins by any amount
    methods = [p("plain", 0, 8, 1000), p("eagle3", 3, 8, 1300), p("dflash", 7, 8, 1301)]
    assert best_per_concurrency(methods, None)[0].best.method == "dflash"


def test_a_method_priced_with_another_models_acceptance_is_not_ranked_beside_one_with_its_own() -> (
    None
):
    from dataclasses import replace

    borrowed = replace(p("p-eagle", 4, 8, 2000), borrowed_from="openai/gpt-oss-20b")
    points = [p("plain", 0, 8, 1000), p("dspark", 3, 8, 1500), borrowed]
    assert best_per_concurrency(points, None)[0].best.method == "dspark"
    # with no speculative method of its own, the borrowed guess is all there is
    alone = [p("plain", 0, 8, 1000), borrowed]
    assert best_per_concurrency(alone, None)[0].best.method == "p-eagle"


def test_deepseek_v4_pro_on_eight_b300_gets_dspark_at_k3_or_less_from_128_streams() -> None:
    """Reference 5.8: from c=128 K=3 beats K=5-7; DSpark is the only drafter published for
    the model, so P-EAGLE and DFlash, priced with other models' acceptance, are not ranked."""
    points = grid("deepseek-ai/DeepSeek-V4-Pro", "B300", gpu_count=8, workload="mixed")
    choices = best_per_concurrency(points, None)
    assert {c.best.method for c in choices} == {"dspark"}
    assert [c.best.k for c in choices if c.concurrency >= 128] == [3, 3]
    assert all(k <= 3 for lo, _, k in k_schedule(points, "dspark") if lo > 64)
    borrowed = {x.method: x.borrowed_from for x in points if x.borrowed_from}
    assert set(borrowed) == {"dflash", "eagle3", "p-eagle"}
