"""slime's examples/coding_agent_rl: generate.py and swe.py copied verbatim from THUDM/slime (commit 624b824a), run
unchanged by tests/integration/test_coding_agent_rl.py."""
