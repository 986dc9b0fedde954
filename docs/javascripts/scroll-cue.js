// Marks every table, code block and figure row wider than the text column, so that the
// stylesheet can show that it scrolls sideways: a shadow on the side with more to see,
// and, above a table or figure, a line saying so. Run on load and on each resize.
(function () {
  const SCROLLERS = "article table, article pre > code, article p:has(> a > img.wide-figure), article p:has(> a > img.two-panels)";

  // The element that holds `el` and does not scroll with it: where the shadows go.
  function frame(el) {
    if (el.tagName === "CODE") return el.parentElement;
    if (el.tagName === "TABLE") return el.closest(".md-typeset__table") || el.parentElement;
    if (!el.parentElement.classList.contains("ntl-frame")) {  // a row of figures scrolls itself
      const wrap = document.createElement("div");
      wrap.className = "ntl-frame";
      el.replaceWith(wrap);
      wrap.appendChild(el);
    }
    return el.parentElement;
  }

  function edges(el) {
    const box = frame(el);
    const more = el.scrollWidth - el.clientWidth;
    box.classList.toggle("ntl-more-left", more > 1 && el.scrollLeft > 1);
    box.classList.toggle("ntl-more-right", more > 1 && el.scrollLeft < more - 1);
  }

  function mark() {
    for (const el of document.querySelectorAll(SCROLLERS)) {
      const wide = el.scrollWidth > el.clientWidth + 1;
      const box = frame(el);
      box.classList.toggle("ntl-wide", wide);
      const above = el.tagName === "TABLE" ? el.closest(".md-typeset__scrollwrap") || box : box;
      const note = above.previousElementSibling;
      const hasNote = note && note.classList.contains("ntl-scroll-note");
      if (wide && el.tagName !== "CODE" && !hasNote) {
        const line = document.createElement("div");
        line.className = "ntl-scroll-note";
        line.textContent = el.tagName === "TABLE"
          ? "Wider than the page: scroll the table sideways for its other columns →"
          : "Wider than the page: scroll sideways for the other panels →";
        above.parentElement.insertBefore(line, above);
      } else if (!wide && hasNote) {
        note.remove();
      }
      if (!el.dataset.ntlCue) {
        el.dataset.ntlCue = "1";
        el.addEventListener("scroll", () => edges(el), { passive: true });
      }
      edges(el);
    }
  }

  if (window.document$) window.document$.subscribe(mark);  // Material's page-ready signal
  else window.addEventListener("load", mark);
  window.addEventListener("resize", mark);
})();
