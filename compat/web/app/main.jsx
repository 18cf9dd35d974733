// A small web app built only from the reference platform's published React
// components, as its web app uses them: the sign-in form, search lists,
// a resource's table, form and history. The test (../browser.test.mjs)
// serves it on its own origin and points it at a sandbot server through the
// ?server= query parameter, so every call is cross-origin (CORS).
//
// Pages are chosen by the location hash: #/ (profile), #/Patient, #/Bot
// (search lists), #/Patient/new, #/<Type>/<id> (table, form, history).
import { MantineProvider } from '@mantine/core';
import { Notifications } from '@mantine/notifications';
import { MedplumClient, normalizeErrorString } from '@medplum/core';
import {
  MedplumProvider,
  ResourceForm,
  ResourceHistoryTable,
  ResourceTable,
  SearchControl,
  SignInForm,
  useMedplum,
  useMedplumProfile,
} from '@medplum/react';
import { StrictMode, useEffect, useState } from 'react';
import { createRoot } from 'react-dom/client';
import '@mantine/core/styles.css';
import '@mantine/notifications/styles.css';
import '@medplum/react/styles.css';

const server = new URLSearchParams(window.location.search).get('server');

// As the reference's web app builds its client (packages/app main.tsx):
// reads issued within 100 ms of each other go out as one batch Bundle.
const medplum = new MedplumClient({
  baseUrl: server,
  autoBatchTime: 100,
  onUnauthenticated: () => navigate('/signin'),
});

function navigate(path) {
  window.location.hash = path;
}

function useHashPath() {
  const [path, setPath] = useState(window.location.hash.slice(1) || '/');
  useEffect(() => {
    const onChange = () => setPath(window.location.hash.slice(1) || '/');
    window.addEventListener('hashchange', onChange);
    return () => window.removeEventListener('hashchange', onChange);
  }, []);
  return path;
}

function Failure({ error }) {
  return error ? <pre data-testid="error">{normalizeErrorString(error)}</pre> : null;
}

function SearchPage({ resourceType, fields }) {
  const [search, setSearch] = useState({ resourceType, fields, count: 20 });
  useEffect(() => setSearch({ resourceType, fields, count: 20 }), [resourceType, fields]);
  return (
    <div data-testid={`search-${resourceType}`}>
      <h2>{resourceType}</h2>
      <SearchControl
        search={search}
        onChange={(e) => setSearch(e.definition)}
        onClick={(e) => navigate(`/${e.resource.resourceType}/${e.resource.id}`)}
        onNew={() => navigate(`/${resourceType}/new`)}
      />
    </div>
  );
}

function NewResourcePage({ resourceType }) {
  const medplum = useMedplum();
  const [error, setError] = useState();
  return (
    <div data-testid="new-resource">
      <h2>New {resourceType}</h2>
      <ResourceForm
        defaultValue={{ resourceType }}
        onSubmit={(resource) =>
          medplum
            .createResource(resource)
            .then((created) => navigate(`/${created.resourceType}/${created.id}`))
            .catch(setError)
        }
      />
      <Failure error={error} />
    </div>
  );
}

function ResourcePage({ resourceType, id }) {
  const medplum = useMedplum();
  const [resource, setResource] = useState();
  const [saved, setSaved] = useState(0);
  const [error, setError] = useState();
  useEffect(() => {
    medplum.readResource(resourceType, id).then(setResource).catch(setError);
  }, [medplum, resourceType, id, saved]);
  if (error) return <Failure error={error} />;
  if (!resource) return <div>Loading</div>;
  return (
    <div data-testid="resource" data-version={resource.meta?.versionId}>
      <h2>
        {resourceType}/{id}
      </h2>
      <section data-testid="resource-table">
        <ResourceTable value={resource} ignoreMissingValues />
      </section>
      <section data-testid="resource-form">
        <ResourceForm
          key={resource.meta?.versionId}
          defaultValue={resource}
          onSubmit={(updated) =>
            medplum
              .updateResource(updated)
              .then(() => setSaved((n) => n + 1))
              .catch(setError)
          }
        />
      </section>
      <section data-testid="resource-history">
        <ResourceHistoryTable key={saved} resourceType={resourceType} id={id} />
      </section>
    </div>
  );
}

function Home() {
  const profile = useMedplumProfile();
  const medplum = useMedplum();
  return (
    <div data-testid="home">
      Signed in as <span data-testid="profile-name">{profile?.name?.[0]?.given?.[0]}</span> in{' '}
      <span data-testid="project-name">{medplum.getProject()?.name}</span>
    </div>
  );
}

const searchFields = { Patient: ['name', 'birthDate', 'gender'], Bot: ['name', 'description'] };

function App() {
  const medplum = useMedplum();
  const profile = useMedplumProfile();
  const path = useHashPath();
  if (medplum.isLoading()) return <div>Loading</div>;
  if (!profile) {
    return <SignInForm onSuccess={() => navigate('/')}>Sign in to sandbot</SignInForm>;
  }
  const [, type, id] = path.split('/');
  if (!type) return <Home />;
  if (!id) return <SearchPage resourceType={type} fields={searchFields[type] ?? ['id']} />;
  if (id === 'new') return <NewResourcePage resourceType={type} />;
  return <ResourcePage resourceType={type} id={id} />;
}

createRoot(document.getElementById('root')).render(
  <StrictMode>
    <MantineProvider>
      <Notifications />
      <MedplumProvider medplum={medplum} navigate={navigate}>
        <App />
      </MedplumProvider>
    </MantineProvider>
  </StrictMode>
);
