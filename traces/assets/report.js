// Small conveniences on a page that reads fine without them: links open the turn they point
// to (a closed <details> would hide it), and each trajectory can expand or collapse its turns.
(function () {
  "use strict";

  function openTarget(hash) {
    if (!hash || hash.length < 2) return;
    var target = document.getElementById(decodeURIComponent(hash.slice(1)));
    if (!target) return;
    for (var node = target; node; node = node.parentElement) {
      if (node.tagName === "DETAILS") node.open = true;
    }
    target.scrollIntoView({ block: "start" });
  }

  document.addEventListener("click", function (event) {
    var link = event.target.closest ? event.target.closest("a[href^='#']") : null;
    if (link) {
      openTarget(link.getAttribute("href"));
      return;
    }
    var button = event.target.closest ? event.target.closest("button.expand-all") : null;
    if (button) {
      var open = button.getAttribute("data-open") === "1";
      var trajectory = button.closest(".trajectory");
      trajectory.querySelectorAll("details.turn").forEach(function (turn) { turn.open = open; });
    }
  });

  window.addEventListener("hashchange", function () { openTarget(location.hash); });
  openTarget(location.hash);
  // Lets a test (or a reader's tooling) see that the script ran in this browser.
  document.body.setAttribute("data-js", "ready");
})();
