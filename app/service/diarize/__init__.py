"""Speaker diarization: who spoke each word (pyannote 3.x's pipeline over the speaker models)."""
