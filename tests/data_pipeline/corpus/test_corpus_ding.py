"""The Ding parser on lines in the real ``usr/share/trans/de-en`` format."""

from __future__ import annotations

from data_pipeline.corpus import ding

SAMPLE = """\
# Version :: devel 2023-01-30
# Copyright (c) :: Frank Richter
Aal {m} [cook.] | Aale {pl} :: eel | eels
annehmbar; passabel {adj} | halbwegs annehmbar | in Ordnung sein | Seine Noten sind passabel. :: \
decent; respectable | half-decent | to be decent | His marks are decent / respectable.
etw. ausblenden {vt} (nicht mehr anzeigen) [comp.] | ausblendend :: \
to hide {hid; hidden} sth. | hiding
das A und O [ugs.] :: the nuts and bolts [coll.]
Kopf {m} <Kopp> | Köpfe {pl} | Kopf hoch! :: head | heads
"""


def test_split_top_ignores_separators_inside_brackets() -> None:
    assert ding.split_top("to hide {hid; hidden} sth.; to mask", ";") == [
        "to hide {hid; hidden} sth.",
        "to mask",
    ]


def test_strip_annotations_removes_all_kinds() -> None:
    assert ding.strip_annotations("das A und O [ugs.]") == "das A und O"
    assert ding.strip_annotations("Aal {m} (auf der Speisekarte) [cook.]") == "Aal"
    assert ding.strip_annotations("Kopf {m} <Kopp>") == "Kopf"
    assert ding.strip_annotations("to hide {hid; hidden} sth.") == "to hide sth."


def test_parse_line_aligns_sub_entries_and_crosses_synonyms() -> None:
    pairs = ding.parse_line(SAMPLE.splitlines()[3])
    assert pairs is not None
    assert ("decent", "annehmbar") in pairs and ("respectable", "passabel") in pairs
    assert ("decent", "passabel") in pairs  # every synonym with every synonym
    assert ("half-decent", "halbwegs annehmbar") in pairs
    assert ("to be decent", "in Ordnung sein") in pairs
    assert ("His marks are decent / respectable.", "Seine Noten sind passabel.") in pairs
    # nothing crosses sub-entry boundaries
    assert ("half-decent", "in Ordnung sein") not in pairs


def test_unequal_sub_entry_counts_are_not_aligned() -> None:
    assert ding.parse_line(SAMPLE.splitlines()[-1]) is None
    assert ding.parse_line("# a comment :: line") is None
    assert ding.parse_line("no separator here") is None


def test_parse_lines_groups_by_line_and_tags_examples() -> None:
    pairs = list(ding.parse_lines(SAMPLE.splitlines()))
    by_en = {p.en: p for p in pairs}
    example = by_en["His marks are decent / respectable."]
    assert example.source == "ding/example"
    assert by_en["to be decent"].source == "ding/phrase"
    assert example.group == by_en["to be decent"].group  # same dictionary line
    assert by_en["the nuts and bolts"].de == "das A und O"
    assert by_en["the nuts and bolts"].group != example.group
    assert by_en["to hide sth."].de == "etw. ausblenden"
    assert all("{" not in p.en + p.de and "[" not in p.en + p.de for p in pairs)
