"""The desktop app. Imports nothing from engine/ but engine.protocol and engine.client."""
