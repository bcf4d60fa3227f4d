"""Hand-built layouts shared by the env tests."""

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
