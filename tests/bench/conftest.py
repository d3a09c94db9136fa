"""The data bench's tests use the data pipeline's prepared directory (one per session)."""

from tests.data_pipeline.conftest import corpus_dir, prepared  # noqa: F401 (fixtures)
