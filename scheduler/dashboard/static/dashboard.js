// scheduler dashboard: the throughput chart (Chart.js) and confirmations. No inline scripts anywhere.
(function () {
  "use strict";
  var COLORS = {
    "enqueued": "#7f8ea3",
    "succeeded": "#1f7a3f",
    "failed, retrying": "#d08a00",
    "dead-lettered": "#b42318"
  };

  function label(ms, bucketMs) {
    var d = new Date(ms);
    var iso = d.toISOString();
    if (bucketMs >= 86400000) return iso.slice(0, 10);
    if (bucketMs >= 3600000) return iso.slice(5, 16).replace("T", " ");
    if (bucketMs >= 60000) return iso.slice(11, 16);
    return iso.slice(11, 19);
  }

  function datasets(data) {
    return Object.keys(data.series).map(function (name) {
      return {
        label: name,
        data: data.series[name],
        backgroundColor: COLORS[name] || "#2457c5",
        borderColor: COLORS[name] || "#2457c5",
        stack: name === "enqueued" ? "in" : "out"
      };
    });
  }

  function caption(box, data) {
    var note = box.querySelector(".chart-note");
    if (!note) return;
    var text = data.events + " newest events, bucket " + (data.bucketMs / 1000) + " s, times in UTC";
    if (data.windowFull) text += " (the newest 10,000 events only)";
    note.textContent = text;
  }

  function startChart(box) {
    var canvas = box.querySelector("canvas");
    var source = box.getAttribute("data-src");
    var every = parseInt(box.getAttribute("data-refresh"), 10) || 5000;
    var chart = null;
    function load() {
      if (document.hidden && chart !== null) return;  // no refresh for a tab nobody looks at
      fetch(source, { credentials: "same-origin", headers: { "Accept": "application/json" } })
        .then(function (response) { return response.ok ? response.json() : null; })
        .then(function (data) {
          if (!data) return;
          var labels = data.labels.map(function (ms) { return label(ms, data.bucketMs); });
          caption(box, data);
          if (chart === null) {
            chart = new window.Chart(canvas, {
              type: "bar",
              data: { labels: labels, datasets: datasets(data) },
              options: {
                animation: false, responsive: true, maintainAspectRatio: false,
                scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true, ticks: { precision: 0 } } },
                plugins: { legend: { position: "bottom" } }
              }
            });
            box.setAttribute("data-ready", "1");
          } else {
            chart.data.labels = labels;
            chart.data.datasets = datasets(data);
            chart.update();
          }
        })
        .catch(function () { /* the next refresh tries again */ });
    }
    load();
    window.setInterval(load, every);
  }

  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll(".chart-box[data-src]"), startChart);
  });

  // The live part is not refreshed while the operator points at or types in it (a button would
  // otherwise be replaced under the mouse), nor while the tab is hidden.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var live = event.detail && event.detail.elt;
    if (!live || live.id !== "live") return;
    if (document.hidden || live.querySelector("form:hover, button:hover, input:focus, select:focus, a:focus")) {
      event.preventDefault();
    }
  });

  // Forms marked data-confirm ask before they submit (bulk actions).
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });
})();
