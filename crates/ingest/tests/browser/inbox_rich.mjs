// Browser test of the example inbox page with rich content (driven by tests/it/browser.rs):
// a Thai date with the Buddhist-era year in the user's time zone (the browser runs in UTC,
// the user is in Asia/Bangkok), the SVG bell with its count and label, an image and two
// action buttons; a notification created between the list and the stream appears; scrolling
// loads the second page; archive and unarchive; an action pressed with the keyboard marks
// the item read and navigates. Talks to the test by lines: prints a step name and waits for
// a line on stdin before going on. Screenshots go to $SHOTS.
import { run } from "./harness.mjs";
import { createInterface } from "node:readline";

const { BASE, TOKEN, SHOTS } = process.env;
const input = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
/** Tells the test `name` was reached and waits for its go-ahead. */
async function step(name) { console.log(name); await input.next(); }
function check(ok, what) { if (!ok) throw new Error(what); }
async function shot(page, name) {
  // From the top, so the sticky header sits where it belongs in a full-page picture.
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: `${SHOTS}/inbox-${name}.png`, fullPage: true });
}

// What a Thai reader expects to see for today's date in Bangkok (UTC+7, no DST), worked
// out by hand rather than with the Intl API the page uses.
const MONTHS = ["มกราคม", "กุมภาพันธ์", "มีนาคม", "เมษายน", "พฤษภาคม", "มิถุนายน", "กรกฎาคม",
                "สิงหาคม", "กันยายน", "ตุลาคม", "พฤศจิกายน", "ธันวาคม"];
const bangkok = new Date(Date.now() + 7 * 3600 * 1000);
const todayThai = `${bangkok.getUTCDate()} ${MONTHS[bangkok.getUTCMonth()]} พ.ศ. ${bangkok.getUTCFullYear() + 543}`;

const ORDER_IMAGE = `<svg xmlns="http://www.w3.org/2000/svg" width="800" height="400" viewBox="0 0 800 400">
  <rect width="800" height="400" fill="#fff1e0"/><rect x="310" y="110" width="180" height="150" rx="14" fill="#d9822b"/>
  <path d="M310 160h180M400 110v50" stroke="#fff" stroke-width="10"/>
  <text x="400" y="330" font-size="40" text-anchor="middle" fill="#7a4a14" font-family="sans-serif">#1001</text></svg>`;

await run(async (browser) => {
  const context = await browser.newContext({ viewport: { width: 412, height: 640 }, locale: "th-TH", timezoneId: "UTC" });
  // The shop's hosts do not exist here: the image and the order page are served by the test.
  await context.route("https://cdn.shop.example.test/**", r => r.fulfill({ contentType: "image/svg+xml", body: ORDER_IMAGE }));
  await context.route("https://shop.example.test/**", r => r.fulfill({
    contentType: "text/html; charset=utf-8", body: "<!doctype html><title>order</title><h1>คำสั่งซื้อ #1001</h1>" }));
  const page = await context.newPage();
  const item = title => page.locator("li.item", { has: page.locator(".title", { hasText: title }) });
  const count = () => page.locator("li.item").count();

  await page.goto(`${BASE}/inbox-example/#token=${TOKEN}&limit=4&hold=stream`);
  await page.waitForFunction(() => document.querySelectorAll("li.item").length === 4 && window.inboxTest);

  // The bell: an SVG drawing (no emoji), the count, and a label a screen reader reads.
  await page.waitForFunction(() => document.getElementById("badge").dataset.count === "6");
  check(await page.locator("#bell svg path").count() === 1, "the bell is not an SVG drawing");
  const bellText = (await page.textContent("#bell")).trim();
  check(bellText === "6", `the bell shows ${JSON.stringify(bellText)}, not just the count`);
  const bellLabel = await page.getAttribute("#bell", "aria-label");
  check(bellLabel === "การแจ้งเตือนที่ยังไม่ได้อ่าน 6 รายการ", `bell label: ${bellLabel}`);

  // Today's heading carries the Thai date with the Buddhist-era year.
  const today = await page.locator("h2.group").first().textContent();
  check(today.startsWith("วันนี้") && today.includes(todayThai), `today's heading: ${today} (want ${todayThai})`);

  // The rich notification: its image, two real buttons, and a relative time.
  const rich = item("ชำระเงินแล้ว #1001");
  await rich.locator("img").evaluate(img => img.decode());
  const img = await rich.locator("img").evaluate(i => ({ src: i.src, w: i.naturalWidth }));
  check(img.src === "https://cdn.shop.example.test/orders/1001.png" && img.w > 0, `image: ${JSON.stringify(img)}`);
  const actions = await rich.locator(".actions > *").evaluateAll(bs => bs.map(b => `${b.tagName}:${b.textContent}`));
  check(actions.join() === "BUTTON:ดูคำสั่งซื้อ,BUTTON:ติดตามพัสดุ", `actions: ${actions}`);
  const when = await rich.locator("time").evaluate(t => ({ text: t.textContent, title: t.title }));
  check(!/25\d\d/.test(when.text) && when.title.includes(String(bangkok.getUTCFullYear() + 543)),
        `today's item time: ${JSON.stringify(when)}`);
  await shot(page, "1-first-page");
  console.log(`TIME ${when.text} | ${when.title}`);

  // A notification created after the list was read and before the stream is opened.
  await step("LISTED");
  await page.evaluate(() => window.inboxTest.connectStream());
  await item("มาระหว่างรอ").waitFor({ timeout: 10000 });
  await page.waitForFunction(() => document.getElementById("badge").dataset.count === "7");
  check(await count() === 5, `after the live one: ${await count()} items`);

  // Scrolling to the end loads the second page, with the older item in its Thai date.
  check(await page.isVisible("#more"), "no way to load more");
  await page.evaluate(() => window.scrollTo(0, document.body.scrollHeight));
  await page.waitForFunction(() => document.querySelectorAll("li.item").length === 7, null, { timeout: 10000 });
  check(await page.isHidden("#more"), "the last page still offers more");
  const old = await item("ข่าวที่ 1").locator("time").textContent();
  check(old.includes("29 พ.ย. 2569") && old.includes("00:30"), `the older item's date: ${old}`);
  const groups = await page.locator("h2.group .label").allTextContents();
  check(groups.join() === "วันนี้,ก่อนหน้านี้", `groups: ${groups}`);
  await shot(page, "2-second-page");

  // Archive takes it off the list; the archive view shows it, and unarchive brings it back.
  await item("ข่าวที่ 3").locator("button.archive").click();
  await item("ข่าวที่ 3").waitFor({ state: "detached" });
  check(await count() === 6, `after archiving: ${await count()} items`);
  await step("ARCHIVED");
  await page.click("#view-archived");
  await item("ข่าวที่ 3").waitFor();
  check(await count() === 1, "the archive view shows only the archived item");
  await shot(page, "3-archived");
  await item("ข่าวที่ 3").getByRole("button", { name: "นำกลับ: ข่าวที่ 3" }).click();
  await item("ข่าวที่ 3").waitFor({ state: "detached" });
  await page.click("#view-inbox");
  await item("ข่าวที่ 3").waitFor();

  // An action, reached with Tab from the item's title and pressed with Enter: read,
  // recorded, and off to the order page.
  await page.evaluate(() => window.scrollTo(0, 0));
  await rich.locator("button.open").focus();
  await page.keyboard.press("Tab");
  const focused = await page.evaluate(() => `${document.activeElement.tagName}:${document.activeElement.textContent}`);
  check(focused === "BUTTON:ดูคำสั่งซื้อ", `Tab from the title reaches ${focused}`);
  await page.screenshot({ path: `${SHOTS}/inbox-4-action-focused.png` });
  await Promise.all([page.waitForURL("https://shop.example.test/orders/1001"), page.keyboard.press("Enter")]);
  console.log(`NAVIGATED ${page.url()}`);

  // Back on the inbox (a fresh load), the item is read.
  await page.goto(`${BASE}/inbox-example/#token=${TOKEN}&limit=4&hold=stream`);
  await page.waitForFunction(() => document.querySelectorAll("li.item").length === 4 && window.inboxTest);
  const cls = await item("ชำระเงินแล้ว #1001").getAttribute("class");
  check(cls.includes("read") && !cls.includes("unread"), `after the click: ${cls}`);
  await page.waitForFunction(() => document.getElementById("badge").dataset.count === "5");
  await shot(page, "5-after-click");
});
