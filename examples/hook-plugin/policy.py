"""A tool-call policy as a hook plugin: no agent deletes a note unless its name starts with "tmp-".

``loopwright_before_tool_call`` runs before every tool call, after its arguments were validated.
Returning ``loopwright.Block(reason)`` stops the call: the tool never runs and the model gets a
``blocked`` result with the reason, so it can explain or try something else. Returning ``None``
lets the call through. Other decisions: ``RequireApproval``, ``ModifyInputs``, ``Respond``
(see docs/hooks.md).
"""

import loopwright


@loopwright.hookimpl
def loopwright_before_tool_call(call: loopwright.ToolCall) -> loopwright.Block | None:
    # A hook implementation takes only the arguments it needs (the hook also offers tool,
    # instance and turn).
    if call.name == "delete_note" and not str(call.arguments.get("name", "")).startswith("tmp-"):
        return loopwright.Block(f"policy: only notes named tmp-* may be deleted, not {call.arguments.get('name')!r}")
    return None
