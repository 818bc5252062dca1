import pytest

from agentroll.errors import UsageError
from agentroll.render.templates import Templates


def test_default_templates_list_every_solution_numbered_in_order():
    (message,) = Templates().messages("selector", "What is 1+1?", ["A \\boxed{2}", "B \\boxed{3}"])
    text = message["content"]
    assert message["role"] == "user" and "What is 1+1?" in text and "Judgment: K" in text
    assert text.index("### Solution 1\nA \\boxed{2}") < text.index("### Solution 2\nB \\boxed{3}")
    assert "### Solution 3" not in text


def test_a_users_folder_with_a_system_template(tmp_path):
    for stage in ("solver", "rewriter", "selector"):
        (tmp_path / f"{stage}.jinja").write_text(f"{stage}: {{{{ problem }}}} {{{{ solutions | length }}}}")
    (tmp_path / "system.jinja").write_text("You are the {{ stage }}.")
    templates = Templates(tmp_path)
    assert templates.messages("rewriter", "P", ["a", "b"]) == [
        {"role": "system", "content": "You are the rewriter."},
        {"role": "user", "content": "rewriter: P 2"},
    ]
    assert templates.fingerprint != Templates().fingerprint


def test_missing_or_misspelt_templates_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match=r"solver\.jinja"):
        Templates(tmp_path)
    for stage in ("solver", "rewriter", "selector"):
        (tmp_path / f"{stage}.jinja").write_text("{{ problme }}")
    with pytest.raises(UsageError, match=r"problme"):
        Templates(tmp_path).messages("solver", "P")


def test_a_template_set_made_for_another_system_says_what_is_needed_and_what_is_there():
    with pytest.raises(UsageError) as caught:
        Templates("code", ("solver", "critic", "reviser"))  # the bundled code set is three-stage's
    said = str(caught.value)
    assert "critic.jinja: not there: this system needs solver.jinja, critic.jinja, reviser.jinja" in said
    assert "has rewriter.jinja, selector.jinja, solver.jinja" in said
