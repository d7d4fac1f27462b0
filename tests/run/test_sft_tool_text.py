"""SFT demonstrations take the world's answers, never a failure caused by the machine's load."""
import pytest

from matpo_jax.run.sft import TransientToolError, tool_text
from matpo_jax.tools import clients as tools_lib


class _Box:
    def __init__(self, result):
        self.result = result

    def call(self, name, arguments):
        return self.result


def test_a_world_answer_is_kept_and_cut_to_the_cap():
    missing = tools_lib.ToolResult("Error: open failed: HTTP 404 no page", False,
                                   tools_lib.CLIENT_ERROR)
    assert tool_text(_Box(missing), "open", 12)(id="X") == missing.text[:12]


@pytest.mark.parametrize("kind", [tools_lib.TIMEOUT, tools_lib.CONNECTION_ERROR,
                                  tools_lib.PROTOCOL_ERROR, tools_lib.SERVER_ERROR])
def test_a_transient_failure_stops_instead_of_becoming_training_data(kind):
    failed = tools_lib.ToolResult("Error: search failed: no complete response in time", False, kind)
    with pytest.raises(TransientToolError, match=kind):
        tool_text(_Box(failed), "search", 100)(query="q")
