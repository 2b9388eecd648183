"""The model repository: a local folder or S3, Triton's layout and config, and the
worker-side download cache."""

from repository_store.cache import ModelCache, PullStats, verify_file
from repository_store.config import (
    ModelConfig,
    backend_of,
    completed_config,
    config_to_triton_json,
    default_model_filename,
    parse_config,
    parse_config_json,
    select_versions,
    validate_config,
)
from repository_store.index import (
    index_model,
    index_models,
    index_repository,
    keep_last_good,
    resolve_ensembles,
)
from repository_store.store import (
    CONFIG_FILENAME,
    FileInfo,
    LocalStore,
    RepositoryStore,
    S3Store,
    open_store,
    validate_model_name,
)
from repository_store.uri import RepositoryURI, parse_repository_uri

__all__ = [
    "CONFIG_FILENAME",
    "FileInfo",
    "LocalStore",
    "ModelCache",
    "ModelConfig",
    "PullStats",
    "RepositoryStore",
    "RepositoryURI",
    "S3Store",
    "backend_of",
    "completed_config",
    "config_to_triton_json",
    "default_model_filename",
    "index_model",
    "index_models",
    "index_repository",
    "keep_last_good",
    "open_store",
    "parse_config",
    "parse_config_json",
    "parse_repository_uri",
    "resolve_ensembles",
    "select_versions",
    "validate_config",
    "validate_model_name",
    "verify_file",
]
