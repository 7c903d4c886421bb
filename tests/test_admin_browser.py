"""The admin in a real browser: headless Chromium at 1400 px, screenshots for the docs.

Skipped when Chromium, ChromeDriver or Selenium is missing. `make screenshots` runs it
with `BK_SCREENSHOTS` set, to write the PNGs the docs show; otherwise they go to a
temporary folder. The lists must fit the window: no column may hide behind a sideways
scroll.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlencode

import pytest
from django.urls import reverse

from bailing_knowledge import services
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import AgentSession, Document, KnowledgeBase, Route
from tests.browser import CHROMEDRIVER, CHROMIUM, HEADLESS_FLAGS

REFUNDS = (
    "# Refund policy\n\nCustomers may return unused items within thirty days for a full "
    "refund. Refunds are paid to the original payment method within five business days."
)
SHIPPING = "# Shipping\n\nOrders ship within two days. A refund of shipping costs is not offered."
RETURNS = "# Returns\n\n" + "Bring the item back with its receipt; a refund follows. " * 30
HIDDEN_BODY = "# Internal\n\nHow refunds are really decided: not for agents of other audiences."
HIDDEN = [
    ("partner-refund-terms.md", "Partner refund terms", {"audiences": ["partners"]}),
    ("refund-ledger.md", "Refund ledger", {"roles": ["finance"]}),
]

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH = 1400
MAX_HEIGHT = 2000
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait
except ImportError:  # pragma: no cover - the dev extra installs it
    webdriver = None


@pytest.fixture
def browser():
    if webdriver is None or CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("headless Chromium, ChromeDriver and Selenium are needed")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        *HEADLESS_FLAGS,
        "--hide-scrollbars",
        f"--window-size={WIDTH},900",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(5)  # element lookups wait for the page that a click loads
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def shots(tmp_path):
    folder = Path(os.environ.get("BK_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def login(browser, live_server, django_user_model):
    django_user_model.objects.create_superuser("admin", "admin@example.com", "admin-password")
    browser.get(live_server.url + reverse("admin:login"))
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("admin-password")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    assert browser.find_element(By.ID, "user-tools")


def capture(browser, folder: Path, name: str) -> Path:
    """A screenshot of the whole page (up to MAX_HEIGHT), WIDTH wide."""
    WebDriverWait(browser, 10).until(
        lambda _: browser.execute_script("return document.readyState") == "complete"
    )
    height, frame = browser.execute_script(
        "return [document.documentElement.scrollHeight, window.outerHeight - window.innerHeight]"
    )
    # The window's size counts the browser's frame; the screenshot shows what is inside it.
    browser.set_window_size(WIDTH, min(max(height, 600), MAX_HEIGHT) + frame)
    target = folder / f"{name}.png"
    browser.save_screenshot(str(target))
    browser.set_window_size(WIDTH, 900)
    assert target.stat().st_size < 300_000, f"{target.name} is too big for the docs"
    return target


def hidden_columns(browser) -> int:
    """Pixels of the change list that only a sideways scroll would show."""
    return browser.execute_script(
        "const t = document.getElementById('result_list');"
        "if (!t) return 0;"
        "const box = t.parentElement.getBoundingClientRect();"
        "return Math.max(0, Math.ceil(t.getBoundingClientRect().right - box.right),"
        " document.documentElement.scrollWidth - window.innerWidth);"
    )


@pytest.fixture
def admin_data(kb, route, agent_client, issued):
    """A small handbook with names as long as real ones, and documents this principal may
    not see for each reason the playground explains."""
    services.update_route(route, name="Order assistant for the customer service desk")
    for n in range(3):
        services.issue_session(
            agent_client,
            principal_id=f"customer-service-agent-{n}@example.com",
            tenant="acme",
            roles=["support", "billing"],
            audience="staff",
            routes=[route],
            device_label="Support laptop",
        )
    upsert_document(kb, "refunds.md", "Refund policy", REFUNDS)
    upsert_document(kb, "shipping.md", "Shipping", SHIPPING)
    upsert_document(
        kb,
        "policies/customer-service/returns-and-refunds-for-online-orders.md",
        "Returns and refunds for online orders placed through the web shop",
        RETURNS,
    )
    for source_key, title, metadata in HIDDEN:
        upsert_document(kb, source_key, title, HIDDEN_BODY, metadata)
    internal = services.create_knowledge_base("internal", title="Internal", enabled=False)
    upsert_document(internal, "refund-fraud-playbook.md", "Refund fraud playbook", HIDDEN_BODY)
    globex = services.create_knowledge_base("globex", title="Globex", tenant="globex")
    upsert_document(globex, "globex-refunds.md", "Globex refund terms", HIDDEN_BODY)
    services.bind_knowledge_bases(route, [internal, globex])
    return route


def test_admin_pages_fit_1400_px_and_are_captured(
    browser, live_server, django_user_model, shots, admin_data, issued
):
    login(browser, live_server, django_user_model)
    route = admin_data
    pages = {
        "documents": reverse("admin:bailing_knowledge_document_changelist"),
        "routes": reverse("admin:bailing_knowledge_route_changelist"),
        "sessions": reverse("admin:bailing_knowledge_agentsession_changelist"),
        "knowledge-bases": reverse("admin:bailing_knowledge_knowledgebase_changelist"),
    }
    overflowing = {}
    for name, url in pages.items():
        browser.get(live_server.url + url)
        assert browser.find_elements(By.ID, "result_list"), name
        if hidden := hidden_columns(browser):
            overflowing[name] = hidden
        capture(browser, shots, f"admin-{name}")
    assert overflowing == {}, "these lists scroll sideways (pixels hidden)"

    kb = KnowledgeBase.objects.get(slug="handbook")
    browser.get(
        live_server.url + reverse("admin:bailing_knowledge_knowledgebase_change", args=(kb.pk,))
    )
    assert browser.find_element(By.LINK_TEXT, "Upload documents")
    assert browser.find_element(By.LINK_TEXT, route.route_key)
    capture(browser, shots, "admin-knowledge-base")

    document = Document.objects.get(source_key="refunds.md")
    browser.get(
        live_server.url + reverse("admin:bailing_knowledge_document_change", args=(document.pk,))
    )
    assert browser.find_elements(By.LINK_TEXT, "Search with this text")
    capture(browser, shots, "admin-document-chunks")

    browser.get(live_server.url + reverse("admin:bailing_knowledge_agentsession_add"))
    # Django 6 heads the two-list selector with a fieldset's legend, 5.2 with a label; 5.2
    # sets labels beside their fields, 6 above them.
    label = browser.find_element(By.CSS_SELECTOR, "label[for=id_routes], .field-routes legend").rect
    client = browser.find_element(By.CSS_SELECTOR, "label[for=id_client]").rect
    selector = browser.find_element(By.CSS_SELECTOR, ".field-routes .selector").rect
    capture(browser, shots, "admin-issue-session")
    assert label["x"] == client["x"], "the Routes label must line up with the other labels"
    beside = label["x"] + label["width"] <= selector["x"]
    above = label["y"] + label["height"] <= selector["y"]
    assert beside or above, "the Routes label must sit beside or above its selector"
    browser.find_element(By.ID, "id_principal_id").send_keys("user-9")
    browser.execute_script(
        "const client = document.getElementById('id_client');"
        "client.value = client.options[1].value;"
        "for (const option of document.getElementById('id_routes_from').options)"
        " option.selected = true;"
        "SelectBox.move('id_routes_from', 'id_routes_to');"
    )
    browser.find_element(By.NAME, "_save").click()
    token = browser.find_element(By.ID, "bk-access-token").get_attribute("value")
    assert token.startswith("bka_")
    copy = browser.find_element(By.CSS_SELECTOR, "[data-copy-target=bk-access-token]")
    copy.click()
    # The clipboard answers asynchronously.
    WebDriverWait(browser, 5).until(lambda _: copy.text == "Copied")

    params = {
        "route": route.pk,
        "session": issued.session.session_id,
        "query": "how long do refunds take",
    }
    browser.get(
        live_server.url
        + reverse("admin:bailing_knowledge_route_playground")
        + "?"
        + urlencode(params)
    )
    hints = browser.find_elements(By.CSS_SELECTOR, "#hints tbody tr")
    assert hints
    assert len(browser.find_elements(By.CSS_SELECTOR, "#hidden tbody tr")) == 4
    page = browser.find_element(By.TAG_NAME, "body").text
    assert "How refunds are really decided" not in page
    for title in ("Partner refund terms", "Refund ledger", "Refund fraud playbook", "Globex"):
        assert title not in page
    assert browser.execute_script(
        "return document.documentElement.scrollWidth <= window.innerWidth"
    ), "the playground scrolls sideways"
    capture(browser, shots, "admin-playground")
    browser.set_window_size(WIDTH, 700)
    browser.execute_script("document.getElementById('hidden-heading').scrollIntoView()")
    browser.save_screenshot(str(shots / "admin-playground-explained.png"))
    browser.find_element(By.CSS_SELECTOR, "#hints tbody tr a").click()
    assert browser.find_element(By.ID, "page-content").text
    capture(browser, shots, "admin-playground-read")
    assert Route.objects.count() and AgentSession.objects.count() >= 4
