"""The work-bound bench's corpus: web-like pages in seven languages, made from a fixed seed.

Each page is what a crawler brings back: a doctype, a head with a title, meta
tags, a style sheet and scripts; a navigation bar, headings, paragraphs with
links and emphasis, lists, now and then a table, a ``<pre>`` block, entities,
comments and the sloppiness browsers forgive (unclosed ``<p>`` and ``<li>``);
a footer.  Languages: English (most pages), German, French, Spanish, Italian,
Dutch, Portuguese; a few pages carry next to no text.  Sizes vary widely (a
log-normal number of paragraphs): from about 1 KB to 45 KB of HTML, half of
them under 8 KB.

``page(n)`` is record ``n``'s page: one of :data:`POOL` pages made once per
process from :data:`SEED` (the same on every machine and run), with the
record's number in its title, heading and address, so that no two records
carry the same page.  Run ``python bench/web_pages.py`` for the corpus's
figures, ``--show N`` for a page.
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import sys
from collections import Counter

__all__ = ["LANGUAGES", "POOL", "SEED", "page"]

SEED = 20_240_043
POOL = 1_000  # distinct pages; record n carries page n % POOL, numbered

# Per language: frequent function words, then content words (nouns, verbs, adjectives).
_WORDS: dict[str, tuple[str, str]] = {
    "en": ("""the of and to a in is it that was for on are with as his they be at have this
        from or had by not but what we can were all there when your which their if will
        about then them would so these her has more could who been than its into only
        other over also after our because you any those should where does just""",
           """time people year way day thing man world life hand part child eye woman place
        work week case point government company number group problem fact city market
        report service price water house business system program question night story
        market result change music garden river village energy school research travel
        weather recipe photo review support account order delivery update feature
        develop provide include continue increase believe happen explain improve share
        important different large small local national public early recent private"""),
    "de": ("""der die und in den von zu das mit sich des auf für ist im dem nicht ein eine
        als auch es an werden aus er hat dass sie nach wird bei einer um am sind noch wie
        einem über einen so zum war haben nur oder aber vor zur bis mehr durch man sein
        wurde sei wir ihr sehr kann schon wenn diese dieser ihre hier keine unter gegen""",
           """Zeit Jahr Menschen Stadt Straße Haus Arbeit Leben Geschichte Frage Unternehmen
        Regierung Kinder Schule Wasser Preis Woche Gemeinde Bürger Größe Möglichkeit
        Entwicklung Verkehr Wetter Rezept Garten Fluss Dorf Forschung Reise Bahnhof
        Geschäft Lösung Erfahrung Verbindung Veranstaltung Öffnungszeiten Bücher Fußball
        Brücke Gebäude Gemüse Küche müssen können möchten gehören erklären ändern
        zurück größer schön wichtig öffentlich natürlich häufig südlich nördlich
        gemütlich täglich"""),
    "fr": ("""le la les de des du et un une est en que qui dans pour pas sur au aux ne se ce
        il elle ils nous vous je par plus avec son sa ses leur mais ou comme tout été sont
        cette être fait ont peut aussi très bien où dont sans entre deux était cela ces""",
           """temps année gens ville rue maison travail vie histoire question entreprise
        gouvernement enfants école eau prix semaine commune citoyens développement
        circulation météo recette jardin rivière village recherche voyage gare magasin
        solution expérience rencontre musée théâtre système société région côté fenêtre
        hôpital château forêt élève réponse création façon première dernière général
        français européen économique sécurité qualité réalité beauté liberté après
        déjà même où très"""),
    "es": ("""el la los las de del y en que un una es por para con no se su sus al lo como
        más pero le ya o este esta fue ha son entre cuando muy sin sobre también me hasta
        hay donde quien desde todo nos durante todos uno les ni contra otros ese eso""",
           """tiempo año gente ciudad calle casa trabajo vida historia pregunta empresa
        gobierno niños escuela agua precio semana pueblo ciudadanos desarrollo tráfico
        clima receta jardín río aldea investigación viaje estación tienda solución
        experiencia reunión música teatro región montaña mañana niño años señor
        compañía información educación población situación relación también después
        aquí así según además económico público político español pequeño"""),
    "it": ("""il lo la i gli le di del della dei delle da in con su per tra un una uno e è
        che non si come più ma anche sono al alla ai alle nel nella questo questa quello
        sua suo loro ci ne noi voi essere stato era hanno ha molto dove quando perché""",
           """tempo anno gente città strada casa lavoro vita storia domanda azienda governo
        bambini scuola acqua prezzo settimana comune cittadini sviluppo traffico tempo
        ricetta giardino fiume paese ricerca viaggio stazione negozio soluzione
        esperienza incontro musica teatro regione montagna perciò però così già più
        società libertà qualità università attività opportunità caffè verità sarà
        italiano europeo pubblico piccolo grande"""),
    "nl": ("""de het een en van in is dat op te zijn met voor niet aan er die ook als bij om
        door maar dan naar wordt uit nog hij ze wel heeft worden kan zo of over meer deze
        tot zich geen hun was waren wij jij ik mijn haar dit al veel hebben werd omdat""",
           """tijd jaar mensen stad straat huis werk leven geschiedenis vraag bedrijf
        regering kinderen school water prijs week gemeente burgers ontwikkeling verkeer
        weer recept tuin rivier dorp onderzoek reis station winkel oplossing ervaring
        bijeenkomst muziek schouwburg gebied bijvoorbeeld eigenlijk natuurlijk
        belangrijk mogelijk verschillende nieuwe gezellig ijs lijst tijdens wijk
        rijden blijven krijgen zijn vrijdag"""),
    "pt": ("""o a os as de do da dos das e em no na nos nas um uma que é para com não se por
        mais como mas ao aos foi ele ela eles seu sua são também já ou quando muito há isso
        está até entre depois sem mesmo pelo pela ser tem você eu este esta""",
           """tempo ano pessoas cidade rua casa trabalho vida história pergunta empresa
        governo crianças escola água preço semana município cidadãos desenvolvimento
        trânsito clima receita jardim rio aldeia pesquisa viagem estação loja solução
        experiência reunião música teatro região montanha informação educação população
        situação relação coração irmão mãe pão não então também português econômico
        público pequeno"""),
}
# The share of pages in each language (a crawl of the web is mostly English).
_SHARES = {"en": 40, "de": 15, "fr": 12, "es": 12, "it": 8, "nl": 6, "pt": 7}
LANGUAGES = tuple(_WORDS)

_NAV = ("Home", "About", "News", "Products", "Blog", "Contact", "Help", "Login", "Search",
        "Shop", "Events", "Careers", "Press", "Privacy", "Terms", "Sitemap", "FAQ", "Archive")
_ENTITIES = ("&amp;", "&nbsp;", "&copy;", "&quot;", "&#8211;", "&raquo;", "&hellip;")
_CLASSES = ("lead", "note", "highlight", "text-muted", "card-body", "col-md-8", "meta")
_STYLE = """
body { font-family: Helvetica, Arial, sans-serif; margin: 0; color: #222; }
.nav a { padding: 0 1em; text-decoration: none; } .nav a:hover { text-decoration: underline; }
article p { line-height: 1.5; max-width: 40em; } .footer { font-size: small; color: #777; }
@media (max-width: 600px) { .nav { display: none; } article { padding: 0 1em; } }
"""
_SCRIPT = """
(function(w, d) { w.dataLayer = w.dataLayer || [];
  function track(e) { w.dataLayer.push({event: e, t: Date.now(), page: d.location.pathname}); }
  d.addEventListener("DOMContentLoaded", function() { track("view");
    var links = d.querySelectorAll("a[data-track]");
    for (var i = 0; i < links.length; i++) { links[i].addEventListener("click", function(ev) {
      track("click:" + ev.target.getAttribute("data-track")); }); } });
})(window, document);
"""


class _Writer:
    """One page's text, drawn from one language's words."""

    def __init__(self, rng: random.Random, language: str):
        self.rng = rng
        function, content = _WORDS[language]
        self.function, self.content = function.split(), content.split()
        # Zipf-like weights: the first words of each list are the most frequent
        self.fw = [1 / (k + 1) for k in range(len(self.function))]
        self.cw = [1 / (k + 1) ** 0.7 for k in range(len(self.content))]

    def words(self, n: int) -> list[str]:
        rng = self.rng
        out = []
        for _ in range(n):
            if rng.random() < 0.45:
                out.append(rng.choices(self.function, self.fw)[0])
            elif rng.random() < 0.03:
                out.append(str(rng.randrange(1, 2030)))
            else:
                out.append(rng.choices(self.content, self.cw)[0])
        return out

    def sentence(self) -> str:
        words = self.words(self.rng.randrange(5, 22))
        if len(words) > 8 and self.rng.random() < 0.4:
            words[self.rng.randrange(3, len(words) - 2)] += ","
        words[0] = words[0][:1].upper() + words[0][1:]
        return " ".join(words) + self.rng.choice(".....?!")

    def marked(self, text: str) -> str:
        """``text`` with some of its words in links, emphasis and spans."""
        rng = self.rng
        words = text.split(" ")
        for _ in range(rng.randrange(0, 4)):
            i = rng.randrange(len(words))
            j = min(len(words), i + rng.randrange(1, 4))
            inner = " ".join(words[i:j])
            tag = rng.choice(("a", "a", "em", "strong", "span", "b", "i"))
            if tag == "a":
                words[i:j] = [f'<a href="/{rng.choice(self.content).lower()}/{rng.randrange(999)}"'
                              f' data-track="{rng.randrange(99)}">{inner}</a>']
            elif tag == "span":
                words[i:j] = [f'<span class="{rng.choice(_CLASSES)}">{inner}</span>']
            else:
                words[i:j] = [f"<{tag}>{inner}</{tag}>"]
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words) + 1), rng.choice(_ENTITIES))
        return " ".join(words)

    def paragraph(self) -> str:
        text = " ".join(self.sentence() for _ in range(self.rng.randrange(1, 7)))
        close = "</p>" if self.rng.random() < 0.9 else ""  # browsers forgive it
        return f"<p>{self.marked(text)}{close}\n"

    def items(self) -> str:
        close = "</li>" if self.rng.random() < 0.8 else ""
        lis = "".join(f"  <li>{self.marked(' '.join(self.words(self.rng.randrange(2, 10))))}{close}\n"
                      for _ in range(self.rng.randrange(3, 9)))
        tag = self.rng.choice(("ul", "ol"))
        return f"<{tag}>\n{lis}</{tag}>\n"

    def table(self) -> str:
        rng = self.rng
        cols = rng.randrange(2, 6)
        head = "".join(f"<th>{w}</th>" for w in self.words(cols))
        rows = "".join("<tr>" + "".join(f"<td>{rng.randrange(10_000) / 100:.2f}</td>"
                                        for _ in range(cols)) + "</tr>\n"
                       for _ in range(rng.randrange(2, 12)))
        return f'<table class="data">\n<thead><tr>{head}</tr></thead>\n<tbody>\n{rows}</tbody></table>\n'


def _make(k: int) -> str:
    """Pool page ``k``, with ``{n}`` where the record's number goes."""
    rng = random.Random(SEED * 10_007 + k)
    language = rng.choices(list(_SHARES), list(_SHARES.values()))[0]
    w = _Writer(rng, language)
    title = " ".join(w.words(rng.randrange(3, 9))).capitalize()
    short = rng.random() < 0.04  # next to no text: a heading and three words
    paragraphs = 1 if short else max(1, min(160, round(rng.lognormvariate(2.3, 0.9))))
    nav = "".join(f'<a href="/{name.lower()}" class="nav-item">{name}</a>\n'
                  for name in rng.sample(_NAV, rng.randrange(4, 12)))
    scripts = "".join(f'<script type="text/javascript">{_SCRIPT * rng.randrange(1, 6)}</script>\n'
                      for _ in range(rng.randrange(0, 4)))
    body: list[str] = []
    for i in range(paragraphs):
        if i and rng.random() < 0.15:
            body.append(f"<h2>{' '.join(w.words(rng.randrange(2, 7))).capitalize()}</h2>\n")
        body.append(w.paragraph() if not short else f"<p>{' '.join(w.words(3))}</p>\n")
        if rng.random() < 0.08:
            body.append(w.items())
        if rng.random() < 0.03:
            body.append(w.table())
        if rng.random() < 0.02:
            body.append(f"<pre>  {' '.join(w.words(6))}\n    {' '.join(w.words(4))}\n</pre>\n")
        if rng.random() < 0.05:
            body.append(f"<!-- {' '.join(w.words(5))} -->\n")
    description = " ".join(w.words(rng.randrange(8, 20)))
    return (f'<!DOCTYPE html>\n<html lang="{language}">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{title} ({{n}})</title>\n"
            f'<meta name="description" content="{description}">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<link rel="canonical" href="https://www.example.{language}/page/{{n}}">\n'
            f"<style>{_STYLE}</style>\n{scripts}</head>\n<body>\n"
            f'<div class="nav"><nav>\n{nav}</nav></div>\n'
            f"<header><h1>{title} {{n}}</h1></header>\n"
            f'<main><article class="{rng.choice(_CLASSES)}">\n{"".join(body)}</article></main>\n'
            f'<footer class="footer"><p>&copy; {rng.randrange(1998, 2025)} Example &middot; '
            f'<a href="/privacy">Privacy</a> &middot; <a href="/terms">Terms</a></p></footer>\n'
            f"{scripts[:len(scripts) // 3]}</body>\n</html>\n")


@functools.lru_cache(maxsize=1)
def _pool() -> tuple[str, ...]:
    return tuple(_make(k) for k in range(POOL))


def page(n: int) -> str:
    """Record ``n``'s page."""
    return _pool()[n % POOL].replace("{n}", str(n))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--show", type=int, metavar="N", help="print record N's page")
    args = parser.parse_args(argv)
    if args.show is not None:
        print(page(args.show))
        return 0
    sizes = sorted(len(p.encode()) for p in _pool())
    languages = Counter(p.split('lang="', 1)[1][:2] for p in _pool())
    print(f"{POOL} pages (seed {SEED}): HTML {min(sizes):,}–{max(sizes):,} bytes, median "
          f"{statistics.median(sizes):,.0f}, mean {statistics.mean(sizes):,.0f}; languages: "
          + ", ".join(f"{lang} {n}" for lang, n in languages.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
