// Shared by the browser tests (tests/it/browser.rs copies it beside each script): launches
// the Chromium of $CHROMIUM, runs `body(browser)`, prints OK when it returns, exits 1 with
// the error when it throws, and closes the browser either way.
import { chromium } from "playwright-core";

/** Runs `body(browser)` in a fresh Chromium, then exits the process. */
export async function run(body) {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  try {
    await body(browser);
    console.log("OK");
  } catch (e) {
    console.error(e);
    process.exitCode = 1;
  } finally {
    await browser.close();
  }
  // stdin (the test's signal) would keep the process alive.
  process.exit(process.exitCode ?? 0);
}
