// Search result excerpts: Sphinx's search reads the text of each page's [role="main"] element, which in
// the book theme also holds the article's header buttons (download, theme switcher), so excerpts began
// with "System Settings Light Dark" or ".ipynb". Read the article itself instead.
document.addEventListener("DOMContentLoaded", () => {
  if (typeof Search === "undefined") return; // only the search page loads searchtools.js
  const original = Search.htmlToText;
  Search.htmlToText = (htmlString, anchor) => {
    const doc = new DOMParser().parseFromString(htmlString, "text/html");
    const article = doc.querySelector('[role="main"] article');
    if (!article) return original(htmlString, anchor);
    for (const query of [".headerlink", "script", "style"]) {
      article.querySelectorAll(query).forEach((el) => el.remove());
    }
    const block = anchor ? article.querySelector(anchor) : null;
    return (block || article).textContent;
  };
});
