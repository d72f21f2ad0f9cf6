"""ChatML chat templates that render tools, for checkpoints whose own template does not: `chatml_tool_template`.

An assistant's tool calls render as `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>` (what SGLang's
qwen25 and hermes tool-call parsers read; `arguments` a JSON string or, as SGLang's chat server passes them, a
mapping), a tool's result in `<tool_response>`; what comes before the turns (the
system turn that lists the tools) is the caller's."""

from __future__ import annotations

# Each message as a ChatML turn, the loop's end and the generation prompt; TOOL_ROLE is a tool result's role.
TURNS = """
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% if m.content %}{{ m.content }}
{% endif %}{% for c in m.tool_calls %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {% if c.function.arguments is string %}{{ c.function.arguments }}{% else %}{{ c.function.arguments | tojson }}{% endif %}}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>TOOL_ROLE
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def chatml_tool_template(head: str, tool_role: str, system_in_head: bool = False) -> str:
    """`head` (Jinja: what comes before the turns), then each message as a ChatML turn, a tool's result as a
    `tool_role` turn (Qwen2.5 writes "user", Hermes "tool"); system messages are left to `head` when
    `system_in_head`."""
    messages = "messages | rejectattr('role', 'equalto', 'system')" if system_in_head else "messages"
    return head + "{% for m in " + messages + " %}" + TURNS.replace("TOOL_ROLE", tool_role)
