from agentroll.record.parsing import answer_content, last_boxed, parse_judgment


def test_answer_is_the_stripped_text_after_the_closing_think_tag():
    assert answer_content("<think>work</think>\n\n The answer is 4. \n") == "The answer is 4."


def test_no_closing_tag_or_nothing_after_it_means_no_answer():
    assert answer_content("<think>still working") is None
    assert answer_content("<think>done</think>   \n") is None
    assert answer_content("no think block at all") is None


def test_more_than_one_closing_tag_is_a_format_violation_with_no_answer():
    assert answer_content("<think>a</think>b</think>c") is None
    assert answer_content("<think>a</think></think>") is None
    assert answer_content("</think>answer") == "answer"  # exactly one close, even without an opening tag


def test_without_thinking_the_whole_response_is_the_answer():
    assert answer_content("  \\boxed{4} ", think=False) == "\\boxed{4}"
    assert answer_content("   ", think=False) is None
    assert answer_content("<think>x</think>y", think=False) == "<think>x</think>y"


def test_last_boxed_balances_braces_and_skips_an_unclosed_last_one():
    assert last_boxed("\\boxed{1} then \\boxed{\\frac{84}{2}}") == "\\frac{84}{2}"
    assert last_boxed("\\boxed{7} and \\boxed{\\frac{1}{") == "7"
    assert last_boxed("no box") is None


def test_first_judgment_wins():
    assert parse_judgment("I pick\nJudgment: 2\nJudgment: 3") == 2
    assert parse_judgment("Judgment:**3**") == 3
    assert parse_judgment("judgment 2") is None
