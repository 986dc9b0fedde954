// Opens every page of the built site (SITE, default build/site) in headless Chromium at a
// laptop's width (1280x800) and a phone's (390x844) and fails if a table, code block or
// row of figures is wider than its column without the scroll cue (docs/javascripts/
// scroll-cue.js), or if a list renders as text (a paragraph with " - " items in it).
// Writes a screenshot of each page's top at each width under SHOTS, if set.
const { chromium } = require("playwright-core");
const fs = require("fs");
const path = require("path");

const site = path.resolve(process.env.SITE || "build/site");
const shots = process.env.SHOTS;
const pages = [];
(function walk(dir) {
  for (const name of fs.readdirSync(dir).sort()) {
    const p = path.join(dir, name);
    if (fs.statSync(p).isDirectory()) walk(p);
    else if (name === "index.html" && !p.includes(`${path.sep}assets${path.sep}`)) pages.push(p);
  }
})(site);

if (pages.length < 10) {  // a site that did not build has nothing to fail on
  console.error(`expected the built site's pages under ${site}, found ${pages.length}`);
  process.exit(2);
}

// A sitemap is published only with the site's address in every entry (docs/hooks/sitemap.py).
const sitemap = path.join(site, "sitemap.xml");
if (fs.existsSync(sitemap)) {
  const text = fs.readFileSync(sitemap, "utf8");
  const locs = [...text.matchAll(/<loc>\s*(\S+?)\s*<\/loc>/g)].map((m) => m[1]);
  if (locs.length < pages.length || !locs.every((l) => /^https?:\/\//.test(l))) {
    console.error(`sitemap.xml lists ${locs.length} absolute address(es) for ${pages.length} pages`);
    process.exit(1);
  }
}

(async () => {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-background-networking", "--disable-gpu"],
  });
  const faults = [];
  for (const [width, height] of [[1280, 800], [390, 844]]) {
    const page = await browser.newPage({ viewport: { width, height } });
    for (const file of pages) {
      const name = path.relative(site, file);
      await page.goto("file://" + file);
      await page.waitForFunction(() => document.querySelector("article") !== null);
      await page.waitForTimeout(400);  // the cue fades in over 0.15 s
      const found = await page.evaluate(() => {
        const out = [];
        const what = (el) => (el.innerText || el.getAttribute("alt") || "").trim().split("\n")[0].slice(0, 60);
        const scrollers = document.querySelectorAll(
          "article table, article pre > code, article p:has(> a > img.wide-figure), article p:has(> a > img.two-panels)");
        for (const el of scrollers) {
          if (el.scrollWidth <= el.clientWidth + 1) continue;
          const frame = el.tagName === "CODE" ? el.parentElement
            : el.tagName === "TABLE" ? el.closest(".md-typeset__table") : el.parentElement;
          const shadow = frame && getComputedStyle(frame, "::after");
          const cued = frame && frame.classList.contains("ntl-wide") && frame.classList.contains("ntl-more-right")
            && shadow.backgroundImage.includes("gradient") && shadow.opacity === "1";
          const above = el.tagName === "TABLE" ? el.closest(".md-typeset__scrollwrap") : frame;
          const noted = el.tagName === "CODE"
            || (above && above.previousElementSibling && above.previousElementSibling.classList.contains("ntl-scroll-note"));
          if (!cued || !noted) out.push(`${el.tagName.toLowerCase()} wider than its column (${el.scrollWidth} > ${el.clientWidth} px) without a scroll cue: "${what(el)}"`);
        }
        for (const p of document.querySelectorAll("article p, article li")) {
          const own = [...p.childNodes].filter((n) => n.nodeType === Node.TEXT_NODE).map((n) => n.textContent).join("");
          if (/(^|\n)\s*(- |\* |\d+\. )\S/.test(own.replace(/^\s+/, "")) || /\n\s*- /.test(own))
            out.push(`a list rendered as text: "${p.innerText.slice(0, 80)}"`);
        }
        return out;
      });
      for (const f of found) faults.push(`${width}px ${name}: ${f}`);
      if (shots) {
        fs.mkdirSync(shots, { recursive: true });
        await page.screenshot({ path: path.join(shots, `${name.replace(/[\\/]/g, "_").replace(/_?index\.html$/, "") || "home"}_${width}.png`) });
      }
    }
    await page.close();
  }
  await browser.close();
  console.log(`${pages.length} pages at 1280 and 390 px: ${faults.length} fault(s)`);
  for (const f of faults) console.log("  " + f);
  process.exit(faults.length ? 1 : 0);
})().catch((e) => { console.error(e); process.exit(2); });
