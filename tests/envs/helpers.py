"""Hand-built layouts shared by the env tests, and a look at the states an oracle sampler draws."""

# A 5x5 maze; the only route from the agent (3, 1) to the target (3, 3) is
# up, up, right, right, down, down (6 moves).
CORRIDOR = {
    "grid": [
        "#####",
        "#...#",
        "#.#.#",
        "#.#.#",
        "#####",
    ],
    "agent": [3, 1],
    "target": [3, 3],
}
CORRIDOR_SOLUTION = [
    "('move', 1)",
    "('move', 1)",
    "('move', 0)",
    "('move', 0)",
    "('move', 3)",
    "('move', 3)",
    "('stop', 'stop')",
]


def labelled_draws(sampler, n: int) -> list[tuple]:
    """`n` single draws of an `rlfw.rollout.demos.DemoSampler`, each with the square it left the agent
    on: (is_junction, feedback, action, the oracle's move from that square, image)."""
    from envs.layout import distances_to, is_junction, parse_layout, path_moves

    out = []
    for _ in range(n):
        image, _, feedback, action = sampler.sample(1)[0]
        u = sampler.env.unwrapped
        walls, agent, target = parse_layout(u.layout())
        moves = path_moves(distances_to(walls, target), agent)
        oracle = u.action_strings[moves[0]] if moves else u.action_strings[-1]
        out.append((is_junction(walls, agent), feedback, action, oracle, image))
    return out
