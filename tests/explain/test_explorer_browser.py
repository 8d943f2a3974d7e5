"""The explorer in a real browser (headless chromium, selenium; conftest.py skips with the reason
where there is none): step through ring all_reduce at P = 4 with the keyboard and check every
step's arrows and holdings against the schedule and the verifier, switch algorithm, compare side
by side, fit a phone's width, and save the screenshots docs/explorer.md shows."""
import os

import pytest

from commlib import explain

import explain_expected as X

# Everything the checks read, in one round trip per step: the arrows, the text list and the cells.
READ_PANEL = """
const p = document.getElementById(arguments[0]);
return {
  alg: p.dataset.alg, step: Number(p.dataset.step), steps: Number(p.dataset.steps),
  arrows: [...p.querySelectorAll("path.msg")].map((a) => [Number(a.dataset.src), Number(a.dataset.dst),
           a.dataset.send, a.dataset.recv, a.dataset.op]),
  said: p.querySelectorAll("li.msg-text").length,
  cells: [...p.querySelectorAll("td[data-rank]")].map((c) => [Number(c.dataset.rank), c.dataset.buf,
          Number(c.dataset.start), Number(c.dataset.len), Number(c.dataset.src),
          c.dataset.ranks ? c.dataset.ranks.split(",").map(Number) : [], c.textContent]),
  label: document.getElementById("step-label").textContent,
};
"""


def shown_holdings(cells, P, buf="output"):
    """{rank: [(src, ranks)] per element} from the table's cells, as explain_expected.per_element."""
    out = {r: [] for r in range(P)}
    for rank, b, start, n, src, ranks, _ in sorted(c for c in cells if c[1] == buf):
        out[rank].extend((src + i if src >= 0 else src, tuple(ranks) if src >= 0 else ()) for i in range(n))
    return out


def check_step(state, scheds, hold, k):
    assert state["step"] == k
    want = X.messages(scheds, k - 1) if k else set()
    assert {tuple(a) for a in state["arrows"]} == want
    assert len(state["arrows"]) == len(want) == state["said"]  # the text alternative says each
    shown = shown_holdings(state["cells"], len(scheds))
    for r, per in enumerate(hold):
        assert shown[r] == X.per_element(per[min(k, len(per) - 1)][1]), (k, r)


def test_ring_all_reduce_in_a_real_browser(browser, tmp_path, shots):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait
    P, n = 4, 8
    path = explain.write_page("all_reduce", "ring", P, n, str(tmp_path / "all_reduce.html"), sizes=[2, 4, 8],
                              counts=[n])
    browser.set_window_size(1280, 1020)
    browser.get(f"file://{path}#alg=ring&P={P}&count={n}&step=0")
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors

    ring, ring_hold = X.schedules("all_reduce", "ring", P, n, [0] * P), X.holdings("all_reduce", "ring", P, n, [0] * P)
    body = browser.find_element(By.TAG_NAME, "body")
    state = browser.execute_script(READ_PANEL, "panel-0")
    assert state["alg"] == "ring" and state["steps"] == 2 * (P - 1)
    for k in range(state["steps"] + 1):
        if k:
            body.send_keys(Keys.ARROW_RIGHT)
        state = browser.execute_script(READ_PANEL, "panel-0")
        check_step(state, ring, ring_hold, k)
        if k == 2:  # mid reduce-scatter: partial sums, the step's arrows
            assert any("x0+x3" in c[6] for c in state["cells"])
            browser.save_screenshot(os.path.join(shots, "explorer-ring-allreduce.png"))
    assert state["label"] == f"Step {state['steps']} of {state['steps']}"
    assert all(c[6].endswith("✓") for c in state["cells"])  # every block final
    body.send_keys(Keys.HOME)
    assert browser.execute_script(READ_PANEL, "panel-0")["step"] == 0
    body.send_keys(Keys.SPACE)  # play: a step a second, until Space again
    WebDriverWait(browser, 10).until(lambda d: d.execute_script(READ_PANEL, "panel-0")["step"] >= 1)
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.SPACE)
    assert browser.find_element(By.ID, "play").text.endswith("Play")  # paused
    body = browser.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.HOME)
    browser.find_element(By.ID, "fwd").click()
    check_step(browser.execute_script(READ_PANEL, "panel-0"), ring, ring_hold, 1)

    # Another algorithm: the panel redraws from its schedule and holdings.
    Select(browser.find_element(By.CSS_SELECTOR, "#panel-0 select.alg")).select_by_value("rabenseifner")
    rab = X.schedules("all_reduce", "rabenseifner", P, n, [0] * P)
    rab_hold = X.holdings("all_reduce", "rabenseifner", P, n, [0] * P)
    state = browser.execute_script(READ_PANEL, "panel-0")
    assert state["alg"] == "rabenseifner"
    check_step(state, rab, rab_hold, 1)
    assert "alg=rabenseifner" in browser.current_url and "step=1" in browser.current_url

    # Side by side: ring again on the left, rabenseifner on the right, one step for both.
    Select(browser.find_element(By.CSS_SELECTOR, "#panel-0 select.alg")).select_by_value("ring")
    body = browser.find_element(By.TAG_NAME, "body")
    body.send_keys("c")
    Select(browser.find_element(By.CSS_SELECTOR, "#panel-1 select.alg")).select_by_value("rabenseifner")
    body = browser.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.ARROW_RIGHT)
    left, right = (browser.execute_script(READ_PANEL, p) for p in ("panel-0", "panel-1"))
    assert (left["alg"], right["alg"]) == ("ring", "rabenseifner")
    check_step(left, ring, ring_hold, 2)
    check_step(right, rab, rab_hold, 2)
    browser.set_window_size(1280, 1560)  # both panels whole, for docs/img
    browser.save_screenshot(os.path.join(shots, "explorer-compare.png"))

    # A phone's width: nothing wider than the screen (tables scroll inside their box).
    browser.set_window_size(390, 900)
    browser.get(f"file://{path}#alg=ring&P={P}&count={n}&step=3")
    width = browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], width
    check_step(browser.execute_script(READ_PANEL, "panel-0"), ring, ring_hold, 3)
    browser.save_screenshot(os.path.join(shots, "explorer-phone.png"))
    for name in ("explorer-ring-allreduce.png", "explorer-compare.png", "explorer-phone.png"):
        with open(os.path.join(shots, name), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
