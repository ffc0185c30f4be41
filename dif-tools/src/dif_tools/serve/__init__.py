"""`dif serve`: OpenAI-style image and video endpoints over one warm pipeline (starlette + uvicorn).

`requests` / `video_requests` parse and check a request body, `generate` runs one request on a pipeline and
writes its files (PNG / MP4), `worker` keeps the prepared pipeline and runs jobs one at a time from a bounded
queue (`replicas`: in Ray actors), `app` is the starlette application, `server` runs it with uvicorn.
"""
