// fairq console: refresh, in-page sorting and confirmations. Plain script, no dependency,
// loaded from /static (the Content-Security-Policy allows no inline script).
"use strict";
(function () {
  function cellValue(td) {
    var v = td.getAttribute("data-v");
    if (v === null) { v = td.textContent.trim(); }
    return v;
  }
  function sortBy(table, index, numeric, asc) {
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows).filter(function (r) { return r.cells.length > index; });
    rows.sort(function (a, b) {
      var x = cellValue(a.cells[index]), y = cellValue(b.cells[index]);
      if (numeric) {
        var fx = x === "" ? -Infinity : parseFloat(x), fy = y === "" ? -Infinity : parseFloat(y);
        return asc ? fx - fy : fy - fx;
      }
      return asc ? x.localeCompare(y) : y.localeCompare(x);
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var heads = table.tHead ? table.tHead.rows[0].cells : [];
    Array.prototype.forEach.call(heads, function (th, index) {
      if (th.querySelector("a")) { return; }  // sorted on the server
      th.classList.add("clickable");
      th.addEventListener("click", function () {
        var asc = th.getAttribute("data-asc") !== "1";
        th.setAttribute("data-asc", asc ? "1" : "0");
        sortBy(table, index, th.getAttribute("data-type") === "num" || th.classList.contains("num"), asc);
      });
    });
  });
  document.querySelectorAll("[data-confirm]").forEach(function (el) {
    el.addEventListener("click", function (ev) {
      if (!window.confirm(el.getAttribute("data-confirm"))) { ev.preventDefault(); }
    });
  });
  document.querySelectorAll("[data-back]").forEach(function (el) {
    el.addEventListener("click", function (ev) {
      if (window.history.length > 1) { ev.preventDefault(); window.history.back(); }
    });
  });
  // Refresh the page every data-refresh seconds while the box is ticked, nobody is typing
  // and the tab is visible; the choice is kept for the session.
  var seconds = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  var box = document.getElementById("autorefresh");
  if (box) {
    box.checked = window.sessionStorage.getItem("fairq-refresh") !== "off";
    box.addEventListener("change", function () {
      window.sessionStorage.setItem("fairq-refresh", box.checked ? "on" : "off");
    });
  }
  if (seconds > 0) {
    window.setInterval(function () {
      var typing = document.activeElement && /^(INPUT|SELECT|TEXTAREA)$/.test(document.activeElement.tagName)
        && document.activeElement !== box;
      if (box && box.checked && !typing && document.visibilityState === "visible") {
        var url = new URL(window.location.href);
        url.searchParams.delete("notice");
        window.location.replace(url.toString());
      }
    }, seconds * 1000);
  }
})();
