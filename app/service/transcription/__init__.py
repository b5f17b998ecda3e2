"""Transcribing a recording: the options of one transcription (`options`) and its job
(`jobs`), the transcriber's window loop (`transcriber`, `windows`, `window_decode`, the fallback
rule in `fallback`), segments and words (`results`, `words`), text as it is decoded
(`text_stream`) and the subtitle and text formats (`formats`)."""
