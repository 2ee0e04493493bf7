// Browser test of the example inbox page (driven by tests/browser.rs): the page receives
// a notification live, shows the right group label, marks all read and the badge drops to
// zero. Prints READY when the page shows the first notification, then waits for a line on
// stdin (the test sends a new notification meanwhile). Screenshots go to $SHOTS.
import { run } from "./harness.mjs";
import { createInterface } from "node:readline";

const { BASE, TOKEN, SHOTS } = process.env;
await run(async (browser) => {
  const page = await browser.newPage();
  await page.goto(`${BASE}/inbox-example/#token=${TOKEN}`);
  await page.waitForSelector("li.unread", { timeout: 10000 });
  await page.waitForFunction(() => document.getElementById("badge").dataset.count === "1");
  await page.screenshot({ path: `${SHOTS}/inbox-1-before.png`, fullPage: true });
  console.log("READY");
  const lines = createInterface({ input: process.stdin });
  for await (const _ of lines) break;
  // The second notification arrives live, without a reload.
  await page.waitForFunction(() => document.querySelectorAll("li").length === 2, null, { timeout: 10000 });
  await page.waitForFunction(() => document.getElementById("badge").dataset.count === "2");
  const groups = await page.$$eval("h2.group .label", hs => hs.map(h => h.textContent));
  if (groups.join() !== "วันนี้") throw new Error(`group labels: ${groups}`);
  const first = await page.$eval("li .title", e => e.textContent);
  if (first !== "ข้อความใหม่แบบสด") throw new Error(`newest first: ${first}`);
  await page.screenshot({ path: `${SHOTS}/inbox-2-live.png`, fullPage: true });
  await page.click("#read-all");
  await page.waitForFunction(() => document.getElementById("badge").dataset.count === "0");
  if (await page.isVisible("#badge")) throw new Error("the badge is still visible");
  await page.screenshot({ path: `${SHOTS}/inbox-3-all-read.png`, fullPage: true });
});
