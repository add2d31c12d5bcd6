"""The spend page in headless Chromium, driven by selenium through chromium-driver.

Run by tests/page.rs with one argument: a JSON file naming the page's URL, the admin
token, and what the audit API answered (the expected values). Prints `PASS <step>`
per step; any failed check raises, which exits non-zero.
"""
import json
import os
import sys
from decimal import Decimal

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

expect = json.load(open(sys.argv[1]))
shots = expect["screenshots"]


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("PURSER_CHROMIUM", "/usr/bin/chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1366,900", "--force-device-scale-factor=1"):
        opts.add_argument(a)
    # The system driver: no download of a driver or a browser, ever.
    service = Service(executable_path=os.environ.get("PURSER_CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(options=opts, service=service)


def shot(d, name, height=None):
    if height:
        d.set_window_size(1366, height)
    d.save_screenshot(os.path.join(shots, name))
    d.set_window_size(1366, 900)


def sign_in(d, token):
    field = d.find_element(By.ID, "token")
    field.clear()
    field.send_keys(token)
    field.send_keys(Keys.ENTER)  # the keyboard submits the form


def loaded(d):
    WebDriverWait(d, 15).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == "true"
    )


d = browser()
try:
    d.get(expect["base"])

    # 1. A wrong token: an error, and no data.
    sign_in(d, "not-the-token")
    err = WebDriverWait(d, 10).until(EC.visibility_of_element_located((By.ID, "error")))
    assert "refused" in err.text, err.text
    assert not d.find_element(By.ID, "main").is_displayed(), "data shown for a wrong token"
    assert d.find_element(By.ID, "total-spend").get_attribute("textContent") == "…"
    assert d.find_elements(By.CSS_SELECTOR, "#requests tbody tr") == []
    assert d.execute_script("return sessionStorage.getItem('purser.audit.token')") is None
    shot(d, "audit-page-wrong-token.png")
    print("PASS wrong token")

    # 2. The right token; the page's total equals /audit/v1/spend.
    sign_in(d, expect["token"])
    loaded(d)
    assert not d.find_element(By.ID, "error").is_displayed()
    assert d.execute_script("return localStorage.length") == 0, "the token must stay in the tab"
    assert d.execute_script("return sessionStorage.getItem('purser.audit.token')") == expect["token"]
    shown = d.find_element(By.ID, "total-spend").text
    assert Decimal(shown) == Decimal(expect["total_spend"]), (shown, expect["total_spend"])
    assert Decimal(expect["total_spend"]) > 0
    exposure = d.find_element(By.ID, "total-exposure").text
    assert Decimal(exposure) > 0, "the timed-out attempt's worst case is exposure, not 0: " + exposure
    shot(d, "audit-page.png", height=1900)
    print("PASS total", shown)

    # 3. Filter to one provider; every listed request touched it.
    box = d.find_element(By.ID, "f-provider")
    box.send_keys(expect["provider"])
    d.execute_script("document.body.removeAttribute('data-loaded')")
    d.find_element(By.ID, "apply").click()
    loaded(d)
    rows = d.find_elements(By.CSS_SELECTOR, "#requests tbody tr[data-request-id]")
    assert rows, "no request listed for the provider"
    req = expect["request"]
    ids = [r.get_attribute("data-request-id") for r in rows]
    assert req["id"] in ids, (req["id"], ids)
    print("PASS filter", len(rows))

    # 4. Open the request: its attempts match /audit/v1/requests/{id}.
    row = d.find_element(By.CSS_SELECTOR, f'#requests tr[data-request-id="{req["id"]}"]')
    row.find_element(By.CSS_SELECTOR, "button.open").click()
    detail = d.find_element(By.ID, "attempts-" + req["id"])
    assert detail.is_displayed()
    got = detail.find_elements(By.CSS_SELECTOR, "table.attempts > tbody > tr")
    assert len(got) == len(req["attempts"]), (len(got), req["attempts"], detail.get_attribute("outerHTML"))
    for tr, a in zip(got, req["attempts"]):
        cell = lambda c: tr.find_element(By.CSS_SELECTOR, "td." + c).get_attribute("textContent")
        assert cell("seq") == str(a["seq"])
        assert cell("provider") == a["provider"], (cell("provider"), a)
        assert cell("klass") == (a["class"] or "in flight")
        assert cell("reason") == (a["reason"] or "")
        assert cell("in") == ("" if a["input_tokens"] is None else str(a["input_tokens"]))
        assert cell("out") == ("" if a["output_tokens"] is None else str(a["output_tokens"]))
        assert cell("basis") == (a["cost_basis"] or "")
        assert cell("plan") == req["plan_id"]
        if a["billing"] == "maybe_billed":
            assert cell("cost") == "up to " + a["worst_case"], cell("cost")
            assert Decimal(a["worst_case"]) > 0
        else:
            assert Decimal(cell("cost")) == Decimal(a["cost"]), (cell("cost"), a["cost"])
    shot(d, "audit-page-attempts.png", height=1900)
    print("PASS attempts", len(got))

    # 5. Escaping: an upstream message with <script> and <img onerror> is text.
    d.find_element(By.ID, "f-provider").clear()
    d.execute_script("document.body.removeAttribute('data-loaded')")
    d.find_element(By.ID, "apply").click()
    loaded(d)
    hostile = d.find_element(By.CSS_SELECTOR, f'#requests tr[data-request-id="{expect["hostile_id"]}"]')
    button = hostile.find_element(By.CSS_SELECTOR, "button.open")
    button.send_keys(Keys.ENTER)  # the keyboard opens a row
    assert button.get_attribute("aria-expanded") == "true"
    detail = d.find_element(By.ID, "attempts-" + expect["hostile_id"])
    messages = [m.get_attribute("textContent") for m in detail.find_elements(By.CSS_SELECTOR, "td.message")]
    assert any("<script>" in m and "onerror" in m for m in messages), messages
    assert d.execute_script("return window.__pwned === undefined"), "ledger text ran as script"
    assert d.find_elements(By.CSS_SELECTOR, "#requests img, #requests script") == [], "ledger text became markup"
    d.execute_script("arguments[0].scrollIntoView()", detail)
    d.save_screenshot(os.path.join(shots, "audit-page-escaping.png"))
    print("PASS escaping")
    # 6. A timed-out attempt (maybe billed, proven cost 0) shows its worst case.
    mb = expect["maybe_billed"]
    row = d.find_element(By.CSS_SELECTOR, f'#requests tr[data-request-id="{mb["id"]}"]')
    row.find_element(By.CSS_SELECTOR, "button.open").click()
    detail = d.find_element(By.ID, "attempts-" + mb["id"])
    for tr, a in zip(detail.find_elements(By.CSS_SELECTOR, "table.attempts > tbody > tr"), mb["attempts"]):
        cost = tr.find_element(By.CSS_SELECTOR, "td.cost").get_attribute("textContent")
        if a["billing"] == "maybe_billed":
            assert cost == "up to " + a["worst_case"], cost
            assert Decimal(a["worst_case"]) > 0
    request_exposure = row.find_element(By.CSS_SELECTOR, "td.exposure").get_attribute("textContent")
    assert request_exposure.startswith("up to ") and Decimal(request_exposure[6:]) > 0, request_exposure
    print("PASS exposure")
finally:
    d.quit()
