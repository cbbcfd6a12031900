"""``POST /v1/embeddings`` on a simulated replica (not served yet)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
