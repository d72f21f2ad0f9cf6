"""Tools for the tool-calling agent example (plugins/tool_agent.py): `async (arguments: dict) -> str`."""
