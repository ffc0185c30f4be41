"""`dif serve`: an OpenAI-style image endpoint over one warm pipeline (starlette + uvicorn).

`requests` parses and checks a request body, `worker` keeps the prepared pipeline and runs jobs one at a
time from a bounded queue, `app` is the starlette application, `server` runs it with uvicorn.
"""
