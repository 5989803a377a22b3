#!/usr/bin/env bash
# Wait for the catalog database, configure iRODS on the first start (setup.json), then run the
# server in the foreground. SIGTERM stops it (docker compose down).
set -euo pipefail
until pg_isready -q -h catalog -p 5432 -d ICAT -U irods; do sleep 1; done
if [ ! -e /etc/irods/server_config.json ]; then
  python3 /var/lib/irods/scripts/setup_irods.py --json_configuration_file=/etc/irods-setup.json
  # setup_irods.py leaves the server running; the foreground one below replaces it.
  su irods -c '/var/lib/irods/irodsctl stop'
fi
exec su irods -c 'exec /usr/sbin/irodsServer -u'
