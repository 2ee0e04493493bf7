// Browser test of the operations console (driven by tests/browser.rs): an operator signs
// in, finds an event by key, sees the failed LINE delivery with the provider's error text,
// presses retry, confirms, and sees it become sent. Screenshots go to $SHOTS.
import { run } from "./harness.mjs";

const { BASE, USER, PASSWORD, EVENT_KEY, PROVIDER_ERROR, SHOTS } = process.env;
await run(async (browser) => {
  const page = await browser.newPage();
  await page.goto(`${BASE}/console`);
  await page.fill("input[name=user]", USER);
  await page.fill("input[name=password]", PASSWORD);
  await page.click("button");
  await page.waitForSelector("text=Outbox lag");
  await page.fill("input[name=q]", EVENT_KEY);
  await page.click("nav button");
  await page.click(`a[href^="/console/events/"]`);
  await page.waitForSelector("td.failed");
  const html = await page.content();
  if (!html.includes(PROVIDER_ERROR)) throw new Error("the provider's error text is not shown");
  await page.screenshot({ path: `${SHOTS}/console-1-failed.png`, fullPage: true });
  await page.click("text=retry now…");
  await page.screenshot({ path: `${SHOTS}/console-2-confirm.png`, fullPage: true });
  await page.click("form[action^=\"/console/actions\"] button");
  // Back on the event page; reload until the worker has sent it.
  for (let i = 0; i < 50; i++) {
    if (await page.isVisible("td.sent")) break;
    await page.waitForTimeout(200);
    await page.reload();
  }
  if (!(await page.isVisible("td.sent"))) throw new Error("the retried delivery did not become sent");
  await page.screenshot({ path: `${SHOTS}/console-3-sent.png`, fullPage: true });
});
