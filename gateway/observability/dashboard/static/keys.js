// The API keys panel, for admins only: the managed keys GET /admin/keys lists, by id. It never holds a key:
// the list shows ids and first characters only.

const when = (t) => (t === null || t === undefined ? "-" : new Date(t * 1000).toLocaleString());

function status(k) {
  if (k.revoked) return "revoked";
  if (k.expired) return "expired";
  return k.revoked_at ? "rotating" : "active";
}

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function keysTable(keys) {
  const table = document.createElement("table");
  table.className = "keys";
  const head = table.createTHead().insertRow();
  for (const h of ["id", "prefix", "name", "tenant", "created", "expires", "last used", "status"]) {
    const th = document.createElement("th");
    th.textContent = h;
    head.append(th);
  }
  const body = table.createTBody();
  for (const k of keys) {
    const row = body.insertRow();
    row.dataset.key = k.id;
    row.className = status(k);
    row.append(cell(k.id, "id"), cell(`sk-sg-${k.prefix}…`, "id"), cell(k.name ?? "-"), cell(k.tenant),
      cell(when(k.created_at)), cell(when(k.expires_at)), cell(when(k.last_used_at)), cell(status(k), "status"));
  }
  return table;
}

/** Draw the panel for an admin (hide it for a tenant); `key` is the dashboard's own key. */
export async function renderKeys(admin, key) {
  const panel = document.getElementById("panel-keys");
  panel.hidden = !admin;
  if (!admin) return;
  const body = panel.querySelector(".body");
  const response = await fetch("/admin/keys", { headers: { Authorization: `Bearer ${key}` }, cache: "no-store" });
  const answer = await response.json().catch(() => null);
  const note = document.createElement("p");
  if (!response.ok) {
    note.className = "error";
    note.textContent = answer?.error?.message || `HTTP ${response.status}`;
    return body.replaceChildren(note);
  }
  note.className = "muted";
  note.textContent = "Keys made through POST /admin/keys; the config file's keys are not listed.";
  body.replaceChildren(answer.data.length ? keysTable(answer.data) : note, ...(answer.data.length ? [note] : []));
}
