"""The login form a browser gets for a page whose reads need the token.

The form's script keeps the token in ``sessionStorage`` (this tab only, as
the controls do), fetches the page the browser asked for again with
``Authorization: Bearer <token>``, puts what comes back in place of the
form and starts the page's own script on it (``window.chalkStart``).  With
a token kept from earlier it does so at once; a wrong one is forgotten and
the form says so.  Nothing of the service is in the form's page: not the
node, not a queue.
"""

from __future__ import annotations

__all__ = ["LOGIN_SCRIPT", "LOGIN_TEMPLATES"]

LOGIN_SCRIPT = """
(function () {
  var form = document.getElementById('chalk-login');
  if (!form) { return; }
  var field = form.querySelector('input[name=token]');
  var note = document.getElementById('login-note');
  function show(text) { form.hidden = false; note.textContent = text; field.focus(); }
  function open(token) {
    fetch(location.href, {cache: 'no-store', headers: {Authorization: 'Bearer ' + token}})
      .then(function (r) { return r.text().then(function (text) { return [r.status, text]; }); })
      .then(function (got) {
        if (got[0] === 401 || got[0] === 429 || got[0] === 403) {
          if (got[0] === 401) { try { sessionStorage.removeItem('chalk-token'); } catch (e) {} }
          show(got[0] === 401 ? 'wrong token' : got[1]);
          return;
        }
        var doc = new DOMParser().parseFromString(got[1], 'text/html');
        document.replaceChild(document.adoptNode(doc.documentElement), document.documentElement);
        if (window.chalkStart) { window.chalkStart(); }
      })
      .catch(function () { show('the service did not answer'); });
  }
  form.addEventListener('submit', function (e) {
    e.preventDefault();
    try { sessionStorage.setItem('chalk-token', field.value); } catch (err) {}
    open(field.value);
  });
  var kept = '';
  try { kept = sessionStorage.getItem('chalk-token') || ''; } catch (e) {}
  if (kept) { open(kept); } else { show(''); }
})();
"""

LOGIN_TEMPLATES = {
    "login.html": """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Chalk · token needed</title><style>{{ style | safe }}</style></head>
<body>
<header><h1>Chalk</h1></header>
<form id="chalk-login" class="controls" hidden>
<p>This console needs its token (<code>[http] read_token</code> or <code>[http] token</code>);
it is kept for this browser tab only.</p>
<label>token <input type="password" name="token" autocomplete="off" size="32" required></label>
<button type="submit">Open</button> <span class="error" id="login-note"></span></form>
<script>{{ script | safe }}</script>
<script>{{ login_script | safe }}</script>
</body></html>
""",
}
