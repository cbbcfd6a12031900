"""Deterministic filler text measured in tokens, so prompts have known lengths without a tokenizer.

Text is built from *units*: a short common English word with its leading space, or a full stop. Each unit
is one token for BPE tokenizers such as Llama 3's (and exactly one for the simulator's tokenizer), and the
units average about 4 characters, so a prompt of N units is about N tokens. Everything is derived from a
string key through its own ``random.Random``, so equal keys give equal text in every process and run.
"""

from __future__ import annotations

import random

_WORD_TEXT = (
    "a an the of to in is it at on by or as be we he so do go up if no my me us am are was had has for and but "
    "not all any can new one two way day man use her him his its our out who how why now few own see say set get "
    "put run big old top low far off end try ask let lot sun sea sky air oil art war law job key map box cup car "
    "bus bed arm leg eye ear hat pen ink tea egg ice fox dog cat cow pig bee ant owl bat rat web net bit log row "
    "fan gas tax fee pay sum mix fit fix cut hit add act aid aim bag bar bay bow boy cap cry dry due fly fur gap "
    "gum hot hug jam jet kid kit lab lap lid lip mad mat mud nap nod nut oak odd pad pan pat pet pie pin pit pop "
    "pot pub rag ram raw red rib rim rod rub rug sad sat saw sew shy sip sit ski sly sob son spy tab tag tan tap "
    "tar tie tin tip toe ton toy tub van vet wax wet win wig yes yet zip zoo able acid also area army away baby "
    "back ball band bank base bath bear beat been beer bell belt best bird blow blue boat body bone book boot "
    "born both bowl burn busy cake call calm came camp card care case cash cell chat chip city clay club coal "
    "coat code cold cook cool copy core corn cost crew crop dark data date dawn dead deal dear debt deep desk "
    "diet dirt disk dish door dose down draw drop drum dust duty each earn east easy edge else even ever face "
    "fact fail fair fall farm fast fear feed feel file fill film find fine fire firm fish five flag flat flow "
    "food foot form four free from fuel full fund gain game gate gave gear gift girl give glad goal gold golf "
    "gone good grew grey grow hair half hall hand hang hard harm head hear heat held help here hero high hill "
    "hire hold hole holy home hope host hour huge idea inch into iron item join jump just keen keep kind king "
    "knee knew know lack lady laid lake land lane last late lead left lend less life lift like line link list "
    "live load loan lock long look lord lose loss lost loud love luck made mail main make male many mark mass "
    "meal mean meat meet menu mere mild mile milk mind mine miss mode mood moon more most move much must name "
    "near neck need news next nice nine none nose note okay once only open over pace pack page paid pain pair "
    "palm park part pass past path peak pick pile pink pipe plan play plot plus poem poet pool poor port post "
    "pull pure push race rail rain rank rare rate read real rely rent rest rice rich ride ring rise risk road "
    "rock role roll roof room root rope rose rule rush safe said sake sale salt same sand save seat seed seek "
    "seem seen self sell send ship shoe shop shot show shut sick side sign site size skin slip slow snow soft "
    "soil sold sole some song soon sort soul spot star stay step stop such suit sure take tale talk tall tank "
    "tape task team tell tend term test text than that them then they thin this thus till time tiny told tone "
    "tool tour town tree trip true tune turn twin type unit upon used user vast very view vote wage wait wake "
    "walk wall want warm wash wave weak wear week well went were west what when whom wide wife wild will wind "
    "wine wing wire wise wish with wood word wore work yard year your zero zone "
)
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())
_FULL_STOP_EVERY = 10  # one unit in about this many is a full stop, so the text reads as sentences


def rng_for(*key: object) -> random.Random:
    """A generator seeded by ``key`` (seeding with a string is stable across processes and Python runs)."""
    return random.Random(":".join(str(part) for part in key))


def units(rng: random.Random, count: int) -> list[str]:
    """``count`` units, always starting with a word and never two full stops in a row."""
    picked = rng.choices(WORDS, k=count)
    out: list[str] = []
    previous_stop = True
    for word in picked:
        if not previous_stop and rng.randrange(_FULL_STOP_EVERY) == 0:
            out.append(".")
            previous_stop = True
        else:
            out.append(" " + word)
            previous_stop = False
    return out


def text(rng: random.Random, tokens: int) -> str:
    """About ``tokens`` tokens of text."""
    return "".join(units(rng, max(tokens, 0)))
