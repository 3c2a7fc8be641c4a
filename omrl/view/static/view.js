// omrl view: the page's only script (served from the package; the CSP allows no inline script).
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  var link = document.getElementById("deeplink");
  var button = document.getElementById("copy-link");
  if (link) {
    link.value = window.location.href.split("#")[0];
  }
  if (link && button) {
    button.addEventListener("click", function () {
      var done = function () { button.textContent = "copied"; };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(link.value).then(done, function () { link.select(); });
      } else {
        link.select();
        try { document.execCommand("copy"); done(); } catch (e) { /* the text stays selected */ }
      }
    });
  }
  document.documentElement.setAttribute("data-view-js", "ready");
});
