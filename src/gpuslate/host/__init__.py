"""The host session: discovery (snapshot), host lock, audit log, state folder."""
