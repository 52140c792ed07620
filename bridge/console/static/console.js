// Times in the viewer's own zone: every <time datetime="..."> the server wrote in UTC (to the
// second, with UTC in its title) is shown in this browser's zone, to the second; hovering
// still shows UTC. Without this script the pages read the same, in UTC.
"use strict";
document.querySelectorAll("time[datetime]").forEach(function (el) {
  var at = new Date(el.getAttribute("datetime"));
  if (isNaN(at.getTime())) {
    return;
  }
  var pad = function (n) { return String(n).padStart(2, "0"); };
  var offset = -at.getTimezoneOffset();
  var sign = offset >= 0 ? "+" : "-";
  offset = Math.abs(offset);
  el.textContent = at.getFullYear() + "-" + pad(at.getMonth() + 1) + "-" + pad(at.getDate()) +
    " " + pad(at.getHours()) + ":" + pad(at.getMinutes()) + ":" + pad(at.getSeconds()) +
    " UTC" + sign + pad(Math.floor(offset / 60)) + ":" + pad(offset % 60);
});
