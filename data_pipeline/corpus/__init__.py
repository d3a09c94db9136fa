"""Corpus builders: the Debian English-German corpus, WMT14 English-German, a synthetic one.

Both write line-aligned UTF-8 files ``DIR/{train,valid,test}.{en,de}`` and ``DIR/corpus.json``
(counts per split and source, what was filtered), the input of ``paperscale prepare``.
"""

from data_pipeline.corpus.debian import fetch_debian_ende
from data_pipeline.corpus.errors import CorpusUnavailable
from data_pipeline.corpus.synthetic import write_synthetic
from data_pipeline.corpus.wmt14 import fetch_wmt14_ende

__all__ = ["CorpusUnavailable", "fetch_debian_ende", "fetch_wmt14_ende", "write_synthetic"]
