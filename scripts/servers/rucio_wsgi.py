"""The Rucio REST application as the test server runs it: behind nginx, which terminates TLS.

Rucio's X.509 login reads the client's certificate subject from the WSGI environment
(``SSL_CLIENT_S_DN``, as Apache's mod_ssl provides it). nginx verifies the client certificate
on the auth port and passes its subject in a header; this moves it where Rucio looks. Only the
nginx auth port sets that header (it overwrites whatever a client sent); the plain http port
is for the tests' other clients on 127.0.0.1.
"""

from rucio.web.rest.flaskapi.v1.main import application as rucio_application

HEADER = "HTTP_X_SSL_CLIENT_S_DN"


def application(environ, start_response):
    dn = environ.pop(HEADER, "")
    if dn:
        environ["SSL_CLIENT_S_DN"] = dn
    return rucio_application(environ, start_response)
