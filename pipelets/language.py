"""Language identification from function words and telltale letters.

Each supported language has a list of its most frequent function words and
a few letters that mark it.  A text scores for a language per word found in
its list (a word that several languages share counts for each, split between
them) and per marking letter; the best score wins when it is clearly ahead.
Small and deterministic, with no data to download; good on sentences and
longer texts, not on single words.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from blackboard import Blackboard
from pipelets._base import Pipelet
from pipelets._config import PipeletConfig
from pipelets._literals import string_values

__all__ = ["LANGUAGES", "LanguageIdentify", "identify_language", "language_scores"]

_STOPWORDS: dict[str, str] = {
    "en": """the of and to a in is it that was for on are with as i his they be at have
        this from or had by not but what we can were all there when your how said an each
        she which do their if will about then them would so these her him has more could
        who been than its into only other my over also after did because our you me any
        those should where does just while most through""",
    "de": """der die und in den von zu das mit sich des auf für ist im dem nicht ein eine
        als auch es an werden aus er hat dass sie nach wird bei einer um am sind noch wie
        einem über einen so zum war haben nur oder aber vor zur bis mehr durch man sein
        wurde sei ich wir ihr sehr kann schon wenn diese dieser ihre hier keine jetzt
        unter gegen immer weil doch wieder nichts""",
    "fr": """le la les de des du et un une est en que qui dans pour pas sur au aux ne se
        ce il elle ils nous vous je par plus avec son sa ses leur mais ou comme tout été
        sont cette être fait ont peut aussi très bien où dont sans entre deux était avait
        cela ces lui même faire leurs après avant encore toujours""",
    "es": """el la los las de del y en que un una es por para con no se su sus al lo como
        más pero le ya o este esta fue ha son entre cuando muy sin sobre también me hasta
        hay donde quien desde todo nos durante todos uno les ni contra otros ese eso ante
        ellos esto antes algunos qué unos yo otro otras otra él tanto esa estos mucho
        nada muchos cual poco ella estar estas algo nosotros puede están tiene está
        dónde cómo porque sí mi aquí bien""",
    "it": """il lo la i gli le di del della dei delle da in con su per tra fra un una uno
        e è che non si come più ma anche sono al alla ai alle nel nella questo questa
        quello sua suo loro ci ne io tu lui lei noi voi essere stato era hanno ha ho
        molto dove quando perché o se già degli dalla sul sulla cosa tutto ogni
        sopra sotto ancora però così sempre dopo senza""",
    "nl": """de het een en van in is dat op te zijn met voor niet aan er die ook als bij
        om door maar dan naar wordt uit nog hij ze wel heeft worden kan zo of over meer
        deze tot zich geen hun was waren wij jij ik mijn haar dit al veel hebben werd
        omdat toen zijn alleen onder tegen waar""",
    "pt": """o a os as de do da dos das e em no na nos nas um uma que é para com não se
        por mais como mas ao aos foi ele ela eles seu sua são também já ou quando muito
        há isso está até entre depois sem mesmo pelo pela ser tem têm você eu este esta
        pelos pelas num numa às essa esse seus suas ainda onde""",
}

#: Letters that point to a language (weight per occurrence).
_LETTERS: dict[str, dict[str, float]] = {
    "de": {"ä": 1.0, "ö": 0.8, "ü": 0.8, "ß": 1.5},
    "fr": {"è": 0.6, "ê": 0.8, "ç": 0.5, "ù": 0.6, "û": 0.8, "ô": 0.3, "î": 0.8, "ë": 0.5,
           "ï": 0.8, "œ": 1.5, "à": 0.3},
    "es": {"ñ": 1.5, "¿": 1.5, "¡": 1.5, "á": 0.3, "í": 0.3, "ó": 0.3, "ú": 0.3},
    "it": {"ì": 1.0, "ò": 1.0, "ù": 0.4, "à": 0.3, "è": 0.4},
    "nl": {"ĳ": 1.5},
    "pt": {"ã": 1.5, "õ": 1.5, "ç": 0.5, "â": 0.5, "ê": 0.3, "ô": 0.3, "á": 0.2, "ó": 0.2},
}
#: Letter pairs that point to a language.
_PAIRS: dict[str, dict[str, float]] = {
    "nl": {"ij": 0.5, "oe": 0.2, "aa": 0.3, "uu": 0.3},
    "de": {"sch": 0.2},
    "en": {"th": 0.15, "wh": 0.2},
}

LANGUAGES: tuple[str, ...] = tuple(_STOPWORDS)
_WORDS: dict[str, set[str]] = {lang: set(words.split()) for lang, words in _STOPWORDS.items()}
_SHARES: Counter[str] = Counter(w for words in _WORDS.values() for w in words)
_TOKEN = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)?")


def language_scores(text: str, languages: tuple[str, ...] = LANGUAGES) -> dict[str, float]:
    """Per language, the evidence in ``text`` (per 100 words; 0 when none)."""
    tokens = [t.lower() for t in _TOKEN.findall(text)]
    if not tokens:
        return {lang: 0.0 for lang in languages}
    counts = Counter(tokens)
    scores: dict[str, float] = {}
    lowered = text.lower()
    letters = Counter(lowered)
    for lang in languages:
        score = sum(n / _SHARES[w] for w, n in counts.items() if w in _WORDS[lang])
        score += sum(letters[ch] * weight for ch, weight in _LETTERS.get(lang, {}).items()) * 0.5
        score += sum(lowered.count(pair) * weight for pair, weight in _PAIRS.get(lang, {}).items()) \
            * 0.1
        scores[lang] = 100.0 * score / len(tokens)
    return scores


def identify_language(text: str, languages: tuple[str, ...] = LANGUAGES, *,
                      min_score: float = 5.0, min_margin: float = 1.2) -> str | None:
    """The language code of ``text``, or None when the evidence is too thin.

    ``min_score``: the winner's evidence per 100 words; ``min_margin``: how
    many times the runner-up's score the winner needs.
    """
    scores = language_scores(text, languages)
    ranked = sorted(scores.items(), key=lambda kv: kv[1], reverse=True)
    if not ranked or ranked[0][1] < min_score:
        return None
    if len(ranked) > 1 and ranked[0][1] < ranked[1][1] * min_margin:
        return None
    return ranked[0][0]


class LanguageIdentify(Pipelet):
    """Write the language (ISO 639-1 code) of a record's text.

    Parameters:
        attribute / attributes: the text attribute(s) (default ``Content``).
        output: the attribute written (default ``language``).
        languages: the candidates, a list or comma-separated (default
            en, de, fr, es, it, nl, pt — all that are supported).
        default: the value written when the language is not clear (default:
            write nothing).
        maxChars: how much text to look at (default 20000).

    Supported: English, German, French, Spanish, Italian, Dutch, Portuguese.
    """

    runs_in_service = True
    parameters = frozenset({"attribute", "attributes", "output", "languages", "default",
                            "maxChars"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.attributes: list[str] = s.names("attributes", "attribute", default=["Content"])
        self.output: str = s.name("output", default="language")
        langs = [lang.lower() for lang in s.names("languages", default=list(LANGUAGES))]
        unknown = [lang for lang in langs if lang not in LANGUAGES]
        if unknown:
            raise s.error("languages", f"not supported: {', '.join(unknown)}; "
                                       f"supported: {', '.join(LANGUAGES)}")
        self.languages = tuple(dict.fromkeys(langs))
        self.default: str | None = s.name("default", default=None)
        self.max_chars: int = s.integer("maxChars", default=20000, minimum=1)

    def process_record(self, blackboard: Blackboard, rid: str) -> None:
        parts: list[str] = []
        size = 0
        for attribute in self.attributes:
            for text in string_values(blackboard, rid, attribute):
                parts.append(text[: self.max_chars - size])
                size += len(parts[-1])
                if size >= self.max_chars:
                    break
        language = identify_language(" ".join(parts), self.languages) or self.default
        if language is not None:
            blackboard.set_literal(rid, self.output, language)
