// infracourse cohort dashboard: sort and filter the learners x weeks grid, in the browser, no server.
// The view lives in the URL's hash (#q=ada&show=stuck&sort=week03&desc=1), so it can be bookmarked or shared.
// Learner-supplied text is only read as text (dataset, textContent); nothing here writes HTML.
(function () {
  "use strict";
  var table = document.getElementById("grid-table");
  var form = document.getElementById("controls");
  if (!table || !form) return;
  var body = table.tBodies[0];
  var rows = Array.prototype.slice.call(body.rows);
  var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
  var column = {};
  heads.forEach(function (th, i) { column[th.dataset.sort] = i; });
  var numeric = function (key) { return key !== "name" && key !== "last"; };

  function read() {
    var p = new URLSearchParams(location.hash.slice(1));
    var sort = p.get("sort");
    return {q: p.get("q") || "", show: p.get("show") || "", sort: sort in column ? sort : "name",
            desc: p.get("desc") === "1"};
  }

  function write(view) {
    var p = new URLSearchParams();
    if (view.q) p.set("q", view.q);
    if (view.show) p.set("show", view.show);
    if (view.sort !== "name") p.set("sort", view.sort);
    if (view.desc) p.set("desc", "1");
    history.replaceState(null, "", p.toString() ? "#" + p.toString() : location.pathname);
    apply(view);
  }

  function apply(view) {
    form.elements.q.value = view.q;
    form.elements.show.value = view.show;
    var i = column[view.sort], sign = view.desc ? -1 : 1;
    var key = function (row) {
      var v = row.cells[i].dataset.v;
      return numeric(view.sort) ? Number(v) : v;
    };
    var sorted = rows.slice().sort(function (a, b) {
      var x = key(a), y = key(b);
      if (x < y) return -sign;
      if (x > y) return sign;
      return a.cells[0].dataset.v < b.cells[0].dataset.v ? -1 : 1;  // ties by name
    });
    var q = view.q.toLowerCase(), shown = 0;
    sorted.forEach(function (row) {
      var keep = (!q || row.cells[0].dataset.v.toLowerCase().indexOf(q) >= 0) &&
                 (!view.show || (" " + row.dataset.flags + " ").indexOf(" " + view.show + " ") >= 0);
      row.hidden = !keep;
      shown += keep ? 1 : 0;
      body.appendChild(row);
    });
    heads.forEach(function (th) {
      if (th.dataset.sort === view.sort) th.setAttribute("aria-sort", view.desc ? "descending" : "ascending");
      else th.removeAttribute("aria-sort");
    });
    form.elements.count.value = shown + " of " + rows.length + " shown";
  }

  heads.forEach(function (th) {
    th.classList.add("sortable");
    th.addEventListener("click", function (event) {
      if (event.target.closest("a")) return;  // the week's own link still opens its page
      var view = read();
      view.desc = view.sort === th.dataset.sort ? !view.desc : numeric(th.dataset.sort);
      view.sort = th.dataset.sort;
      write(view);
    });
  });
  form.addEventListener("input", function () {
    var view = read();
    view.q = form.elements.q.value;
    view.show = form.elements.show.value;
    write(view);
  });
  form.addEventListener("submit", function (event) { event.preventDefault(); });
  window.addEventListener("hashchange", function () { apply(read()); });
  form.hidden = false;
  apply(read());
})();
